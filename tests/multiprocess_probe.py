"""A stand-in for ``launch.main`` in the launcher's tests: process 0 fails at once with
status 3, every other process sleeps for ten minutes (a survivor that never notices)."""

import sys
import time

if __name__ == "__main__":
    process_id = int(next(a for a in sys.argv if "process_id=" in a).split("=")[1])
    print(f"probe {process_id} started", flush=True)
    if process_id == 0:
        sys.exit(3)
    time.sleep(600)
