"""TRL's GRPO API on grpokit: a TRL program runs by changing one import.

    from grpokit.trl import GRPOConfig, GRPOTrainer      # instead of: from trl import ...

`GRPOConfig` takes TRL 1.16's field names and defaults (a real `trl.GRPOConfig` works too);
`GRPOTrainer` takes TRL's arguments and trains with grpokit's loop. Every TRL field is mapped to
grpokit's config or refused with a one-line reason (`grpokit.trl.fields`, docs/coming_from_trl.md).
"""

from grpokit.trl.config import GRPOConfig
from grpokit.trl.fields import FIELDS, mapping_table
from grpokit.trl.trainer import GRPOTrainer
from grpokit.trl.translate import translate

__all__ = ["FIELDS", "GRPOConfig", "GRPOTrainer", "mapping_table", "translate"]
