"""An analysis worker in which the first recording it closes at STOP fails to close, as one on a
full disk can (tests/test_worker_stop_closes_each_recording.py)."""

from streamtap.mitm import worker
from streamtap.mitm.flowtap import FlowTap


def serve(inbox, outbox, ring_path: str, ring_size: int) -> None:
    abandon, failed = FlowTap.abandon, []

    def first_fails(tap: FlowTap) -> None:
        if not failed:
            failed.append(tap)
            raise OSError(28, "No space left on device")
        abandon(tap)

    FlowTap.abandon = first_fails
    worker.serve(inbox, outbox, ring_path, ring_size)
