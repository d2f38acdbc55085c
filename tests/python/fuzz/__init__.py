"""attnrt's mutation fuzzer for the `attnrt` binary (issue 28, item 4); entry: scripts/fuzz.py.

A case is one shipped model changed one to three times, through the onnx API
(``mutate_model``: a dim, an element type, an attribute, a name, an op type, a node deleted,
duplicated or moved, an initializer's dims or type without its data...) or on its serialized
bytes (``mutate_bytes``: flips, truncation, insertion); ``cases`` draws them from a seed.
``execute`` runs ``attnrt run --no-diff`` and ``attnrt fuse`` on each under a time and memory
limit and sorts the outcome; ``findings`` saves every failure as a reproducer; ``campaign``
runs the cases on worker processes; ``rust_fuzzers`` runs the cargo-fuzz target and the
stable in-process harness where they can run.
"""
