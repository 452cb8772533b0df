"""A backend whose own dependencies are missing on this machine (sglang's
ascend backend without an NPU): its import fails with something other than
ImportError, and install() must skip it, not fail."""

raise RuntimeError("no Ascend NPU on this machine")
