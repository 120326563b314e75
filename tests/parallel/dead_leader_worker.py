"""One process of the dead-leader check: join a 2-process jax.distributed group, broadcast once, then wait.

    dead_leader_worker.py --coordinator_address=localhost:PORT --num_processes=2 --process_id=0   # sleeps
    dead_leader_worker.py --coordinator_address=localhost:PORT --num_processes=2 --process_id=1

Process 1 then blocks in `broadcast_object`, where a multi-host server's
follower (`async_engine.run_follower`) waits for process 0's next step.
"""

import sys
import time

from absl import app

from jaxpaged import distributed


def main(argv):
    del argv
    distributed.initialize_from_flags()
    assert distributed.broadcast_object({"step": 1} if distributed.is_leader() else None) == {"step": 1}
    print("joined", flush=True)
    if distributed.is_leader():
        time.sleep(3600)  # the test kills it
        return
    distributed.broadcast_object(None)  # never answered: process 0 is killed
    sys.exit(0)


if __name__ == "__main__":
    app.run(main)
