"""An analysis worker whose process ends two seconds after it closed its pipes, as one at nice 10
on a busy machine can take to get through the interpreter's teardown (tests/test_workers.py)."""

import time

from streamtap.mitm import worker


def serve(inbox, outbox, ring_path: str, ring_size: int) -> None:
    worker.serve(inbox, outbox, ring_path, ring_size)
    inbox.close()
    outbox.close()
    time.sleep(2)
