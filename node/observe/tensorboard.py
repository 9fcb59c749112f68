"""TensorBoard scalars of a run (`run.tensorboard = true`): every numeric metric of every round at
step = round, in one event file under `<run_dir>/tensorboard/` (`tensorboard --logdir <run_dir>`).

metrics.jsonl is the truth and the event file mirrors it. When the node logs its first round, the
event file is written anew from metrics.jsonl as it stands then (a resume has already cut it back
to the checkpoint) and the old files go, keeping the wall times they held; each later round is
appended and flushed at once. So after a resume TensorBoard shows each round once, with the values
of the run that continued, never the rounds the crash threw away; no viewer needs to honour purge
events for that (not every TensorBoard data loader does).

Names are metrics.jsonl's: nested dicts flattened with "/" (external_tiers -> external_tiers/0,
heldout_by_family/<family>/pass1); booleans as 0/1; strings, lists and nulls are not scalars.
The writer (tensorboardX) is imported only when the option is on.
"""
from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import Iterator

from node.observe.metrics import read_metrics

TB_DIR = "tensorboard"
EVENT_FILE_MARK = ".out.tfevents."  # how TensorBoard recognises an event file


def scalars(row: dict, prefix: str = "") -> dict[str, float]:
    """The numeric leaves of a metrics row; `round` is the step, not a scalar."""
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if name == "round":
            continue
        if isinstance(value, dict):
            out.update(scalars(value, name + "/"))
        elif isinstance(value, (bool, int, float)):
            out[name] = float(value)
    return out


def event_files(directory: Path) -> list[Path]:
    return sorted(p for p in Path(directory).glob(f"*{EVENT_FILE_MARK}*") if p.is_file())


def read_records(path: Path) -> Iterator[bytes]:
    """The records of a TFRecord file (length, its CRC, data, its CRC); stops at a torn tail."""
    data = Path(path).read_bytes()
    at = 0
    while at + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        end = at + 12 + length + 4
        if end > len(data):
            return  # killed mid-write
        yield data[at + 12:at + 12 + length]
        at = end


def read_scalars(directory: Path) -> dict[str, dict[int, tuple[float, float]]]:
    """tag -> step -> (wall time, value) of every scalar in the event files of `directory`, in
    file order (a later file's value for a step wins, as it does in TensorBoard)."""
    from tensorboardX.proto.event_pb2 import Event  # tensorboardX: loaded only where run.tensorboard is on

    out: dict[str, dict[int, tuple[float, float]]] = {}
    for path in event_files(directory):
        for record in read_records(path):
            event = Event.FromString(record)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    out.setdefault(value.tag, {})[event.step] = (event.wall_time, value.simple_value)
    return out


class TensorBoardLog:
    """Mirrors metrics.jsonl into an event file; `write` after each MetricsLog.append."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / TB_DIR
        self._writer = None

    def write(self, row: dict) -> None:
        """Round `row` (already in metrics.jsonl) as scalars at step row["round"], flushed."""
        if self._writer is None:
            self._rewrite(int(row["round"]))  # row is among metrics.jsonl's rows
        else:
            self._add(row, time.time())
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _rewrite(self, current: int) -> None:
        """A new event file with every row of metrics.jsonl; rounds before `current` keep the wall
        time the old files gave them (a round at or after it was thrown away by a resume)."""
        from tensorboardX.event_file_writer import EventsWriter  # tensorboardX: only with run.tensorboard on

        old = event_files(self.dir)
        kept_times = {step: at for steps in self._old_scalars().values() for step, (at, _) in steps.items()
                      if step < current}
        self.dir.mkdir(parents=True, exist_ok=True)
        # a name of our own: EventsWriter names files by the second, and must not reopen an old one
        self._writer = EventsWriter(str(self.dir / "events"), filename_suffix=f".{os.getpid()}.{time.time_ns()}")
        now = time.time()
        for row in read_metrics(self.run_dir):
            self._add(row, kept_times.get(int(row["round"]), now))
        self._writer.flush()
        for path in old:  # only once the new file holds every kept round
            path.unlink(missing_ok=True)

    def _old_scalars(self) -> dict[str, dict[int, tuple[float, float]]]:
        from google.protobuf.message import DecodeError  # with tensorboardX's messages: only when it is on

        try:
            return read_scalars(self.dir)
        except (OSError, DecodeError):  # a damaged old file only costs wall times: values come from metrics.jsonl
            return {}

    def _add(self, row: dict, wall_time: float) -> None:
        from tensorboardX.proto.event_pb2 import Event  # tensorboardX: only with run.tensorboard on
        from tensorboardX.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=tag, simple_value=v) for tag, v in scalars(row).items()]
        self._writer.write_event(Event(wall_time=wall_time, step=int(row["round"]), summary=Summary(value=values)))
