"""An OpenEnv server module that fails at import (the ``openenv`` task names its last line of stderr)."""

raise ImportError("the simulator's native library is missing")
