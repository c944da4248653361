"""Every generated measured block of docs/, by module: scripts/update_readme.py writes them and
tests/cli/test_readme.py checks each against its raw files and puts an edited figure back.

    docs_measured.py  experiments, reward models, memory      docs_bench.py   `grpokit bench` tables
    docs_real.py      SmolLM2 runs (real_model.md)             docs_gains.py   speed-ups, natural lengths
    docs_claims.py    experiments.md's claims summary          docs_precision.py  precision.md's rates,
                                                                                  passes and phases
    docs_vllm.py      vllm.md's mismatch and samplers         docs_race_band.py  the arithmetic race's seeds
    docs_reliability.py  the soak (reliability.md), the TRL conformance run (coming_from_trl.md)
"""

from docs_bench import BLOCKS as BENCH
from docs_claims import BLOCKS as CLAIMS
from docs_gains import BLOCKS as GAINS
from docs_measured import BLOCKS as MEASURED
from docs_precision import BLOCKS as PRECISION
from docs_race_band import BLOCKS as RACE_BAND
from docs_real import BLOCKS as REAL
from docs_reliability import BLOCKS as RELIABILITY
from docs_vllm import BLOCKS as VLLM

ALL = (MEASURED, BENCH, REAL, GAINS, CLAIMS, PRECISION, VLLM, RACE_BAND, RELIABILITY)
