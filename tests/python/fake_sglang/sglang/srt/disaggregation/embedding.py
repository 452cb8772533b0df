"""An sglang module that imports poll_and_all_reduce by name, imported by the
tests only after install(): it takes the wrapper, and uninstall() must put
sglang's original back there too."""

from sglang.srt.disaggregation.utils import poll_and_all_reduce  # noqa: F401
