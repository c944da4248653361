"""A stub decoder for the search tests: hand-made completions and steps whose tokens can be counted."""

from grpokit.search.common import Completion


class StubDecoder:
    """`Decoder`'s interface over fixed texts; one character = one token (the char tokenizer's ids).

    complete(): the i-th prompt's completions are `groups[prompt]`, each counted as len(text) + 1 (EOS).
    extend(): a partial solution with d finished steps gets, for continuation j, the step f"{j}{d}. "
    while d < depth, else the final step f"\\boxed{{{j}}}" + EOS; every call is recorded."""

    def __init__(self, tokenizer, groups=None, depth: int = 2, max_new_tokens: int = 64) -> None:
        self.tokenizer, self.groups, self.depth = tokenizer, groups or {}, depth
        self.max_new_tokens = max_new_tokens
        self.calls = []            # (prefixes, n, limits) per extend call
        self.decoded = []          # every Completion handed out

    def complete(self, prompts, n, *, greedy=False):
        out = []
        for p in prompts:
            group = [Completion(t, len(t) + 1, True) for t in self.groups[p][:n]]
            self.decoded += group
            out.append(group)
        return out

    def prompt_ids(self, prompt):
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"]

    def extend(self, prefixes, n, limits, separator):
        self.calls.append(([list(p) for p in prefixes], n, list(limits)))
        eos = self.tokenizer.eos_token_id
        out = []
        for prefix in prefixes:
            text = self.tokenizer.decode(prefix, skip_special_tokens=True)
            d = text.count(separator)
            group = []
            for j in range(n):
                step = f"{j}{d}{separator}" if d < self.depth else f"\\boxed{{{j}}}"
                ids = self.tokenizer(step, add_special_tokens=False)["input_ids"] + ([eos] if d >= self.depth
                                                                                     else [])
                group.append(Completion(step, len(ids), d >= self.depth, ids))
            self.decoded += group
            out.append(group)
        return out
