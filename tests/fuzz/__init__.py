"""A structure-aware fuzzer for the broker's request path.

`frames` builds valid requests of every advertised API and version from kio's
schemas (random values from small pools, so requests meet existing topics and
groups), encodes them while noting where every length field sits, and mutates them:
lying lengths, truncation, junk appended, byte flips, random bodies, lying client id
lengths. `driver` sends them to a real broker process over many connections and
records crashes, tracebacks in the broker log, replies that do not decode, and the
broker's memory. Run it with `make fuzz` or `python -m tests.fuzz --frames N --seed S`.

No module here is named test_*, so pytest does not collect it;
`tests/integration/test_fuzz.py` runs a short, seeded pass in CI.
"""
