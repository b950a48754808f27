"""The rescale tool's former module name, kept importable: everything lives in
:mod:`keyedstate.offline.rescale`."""
from .rescale import RescaleError, RescaleResult, refuse_checkpoint_format_2, rescale  # noqa: F401
from .rescale.driver import Rescale as _Rescale  # noqa: F401
from .rescale.merge import MergeTask as _MergeTask, merge as _merge, stage_ingested as _stage_ingested  # noqa: F401
from .rescale.routing import HeirFiles as _HeirFiles, write_by_key_group as _write_by_key_group  # noqa: F401
from .rescale.tasks import SplitTask as _SplitTask  # noqa: F401
