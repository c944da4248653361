"""A stub decoder for the search tests: hand-made completions and steps whose tokens can be counted."""

from grpokit.search.common import Completion


class StubDecoder:
    """`Decoder`'s interface over fixed texts; one character = one token (the char tokenizer's ids).

    complete(): the i-th prompt's completions are `groups[prompt]`, each counted as len(text) + 1 (EOS).
    extend(): a partial solution with d finished steps gets, for continuation j, the step f"{j}{d}. "
    while d < depth, else the final step f"\\boxed{{{j}}}" + EOS; with separator None, the whole rest
    of the solution (those steps up to the box). j is the continuation's index in its call, or with
    cycle=True a count over every continuation handed out (0, 1, 2, ...). Every call is recorded. Each
    token of the k-th continuation handed out (k = 0, 1, ...) has log-prob -(k + 1)."""

    def __init__(self, tokenizer, groups=None, depth: int = 2, max_new_tokens: int = 64,
                 cycle: bool = False) -> None:
        self.tokenizer, self.groups, self.depth = tokenizer, groups or {}, depth
        self.max_new_tokens, self.cycle, self.count = max_new_tokens, cycle, 0
        self.eos_ids = [tokenizer.eos_token_id]
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
        eos, sep = self.tokenizer.eos_token_id, separator or ". "
        out = []
        for prefix in prefixes:
            d = self.tokenizer.decode(prefix, skip_special_tokens=True).count(sep)
            group = []
            for i in range(n):
                j = self.count % 10 if self.cycle else i
                self.count += 1
                last = self.depth + 1 if separator is None else d + 1
                step = "".join(f"{j}{k}{sep}" for k in range(d, min(last, self.depth)))
                if last > self.depth:
                    step += f"\\boxed{{{j}}}"
                ended = last > self.depth
                ids = self.tokenizer(step, add_special_tokens=False)["input_ids"] + ([eos] if ended else [])
                lp = -float(len(self.decoded) + len(group) + 1)
                group.append(Completion(step, len(ids), ended, ids, [lp] * len(ids)))
            self.decoded += group
            out.append(group)
        return out
