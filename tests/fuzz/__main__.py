"""`python -m tests.fuzz --frames N --seed S`: fuzz a fresh broker; exit 1 on any
crash or traceback. `--replay HEX` sends one frame printed by an earlier run. Then
`--handshake N` scenarios (default 5000; 0 skips them) fuzz the SASL handshake of
another broker (tests/fuzz/handshake.py): exit 1 if it ends, logs an error, serves a
request before authentication or stops serving a good client. `--frames 0` runs the
handshake part alone."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

from tests.fuzz.driver import Options, replay, run
from tests.fuzz.handshake import run_handshake


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=None, help="default: a random seed")
    parser.add_argument("--workers", type=int, default=8, help="concurrent connections")
    parser.add_argument("--round", type=int, default=500, help="frames between health checks")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for a reply")
    parser.add_argument("--data-dir", type=Path, default=None, help="keep broker data here")
    parser.add_argument("--keep-going", action="store_true", help="do not stop at a crash")
    parser.add_argument("--replay", metavar="HEX", help="send one frame (no size prefix)")
    parser.add_argument(
        "--handshake", type=int, default=5000, metavar="N", help="SASL handshake scenarios"
    )
    args = parser.parse_args(argv)
    if args.replay:
        return replay(args.replay)
    seed = args.seed if args.seed is not None else random.randrange(1, 2**31)
    failed = False
    if args.frames > 0:
        print(f"fuzzing with seed {seed}: {args.frames} frames, {args.workers} connections")
        report = run(
            Options(
                seed=seed,
                frames=args.frames,
                workers=args.workers,
                round_size=args.round,
                timeout_s=args.timeout,
                data_dir=args.data_dir,
                stop_on_crash=not args.keep_going,
            )
        )
        print(report.summary())
        failed = not report.ok
    if args.handshake > 0 and not (failed and not args.keep_going):
        print(f"fuzzing the SASL handshake with seed {seed}: {args.handshake} scenarios")
        handshake = run_handshake(seed, args.handshake, args.workers)
        print(handshake.summary())
        failed = failed or not handshake.ok
    if failed:
        print(f"FAILED (seed {seed}); reproduce with: python -m tests.fuzz --seed {seed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
