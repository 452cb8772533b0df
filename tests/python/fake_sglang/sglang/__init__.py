"""A stand-in for the `sglang` package, shaped like sglang's disaggregation
code (python/sglang/srt/disaggregation/ upstream) for kvcoord's tests:
the same module paths, names, signatures and bookkeeping rules (written for
these tests, not copied), and none of sglang's other dependencies.
kvcoord.sglang.install() must patch it exactly as it would sglang."""
