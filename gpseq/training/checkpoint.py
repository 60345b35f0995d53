"""Training checkpoints: model + optimiser + step, with the trainer's bookkeeping, written atomically.

`directory/checkpoint/` holds `ckpt*` (a `tf.train.Checkpoint`), `state.json` (the trainer's state
and the shape of every model variable, so that resuming with another configuration or corpus names
what differs) and `best.npz` (the variables at the best dev score so far). A new checkpoint is
written to a temporary sibling and renamed into place (`corpora/_atomic.swap_dir`, as a model
directory is), so a killed run leaves the previous one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf

from gpseq.errors import ConfigError

ADVICE = "use another --checkpoint-dir, delete it, or train without --resume"
# 2: variables named by their part of the composed StructuredGP (e.g. unaries/label_bias); a
# checkpoint of format 1 names them without it (label_bias)
CHECKPOINT_FORMAT = 2


def variable_shapes(model) -> dict[str, list[int]]:
    """{path of each variable in `model`: shape} (what a checkpoint must match to be restored)."""
    flatten = getattr(model, "_flatten", None)
    if flatten is not None:
        found = flatten(predicate=lambda v: isinstance(v, tf.Variable), with_path=True)
        named = (("/".join(str(part) for part in path), v) for path, v in found)
    else:
        named = ((f"{i}:{v.name}", v) for i, v in enumerate(model.trainable_variables))
    return {name: [int(d) for d in variable.shape] for name, variable in named}


class Checkpoints:
    """The checkpoint of `model`, `optimizer` and `step` (a `tf.Variable`) in `directory`.

    Only the chief writes; other workers write their (identical) variables to a temporary
    directory and delete it, since saving mirrored variables is collective.
    """

    def __init__(self, directory: str | os.PathLike, model, optimizer, step: tf.Variable, *, is_chief: bool = True):
        self.directory = Path(directory)
        self.model, self.is_chief = model, is_chief
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)

    def save(self, state: dict, best_values: list[np.ndarray] | None) -> None:
        """Writes the checkpoint with the trainer's `state` (JSON-able) and `best_values`."""
        if not self.is_chief:
            scratch = Path(tempfile.mkdtemp(prefix="gpseq-worker-ckpt-"))
            try:
                self._checkpoint.write(str(scratch / "ckpt"))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            return
        from gpseq.corpora._atomic import swap_dir, temp_dir_beside
        from gpseq.saved.directory import check_checkpoint_target

        final = self.directory / "checkpoint"
        tmp = temp_dir_beside(final)
        try:
            self._checkpoint.write(str(tmp / "ckpt"))
            with open(tmp / "state.json", "w") as handle:
                json.dump({**state, "best_values": None, "variables": variable_shapes(self.model),
                           "checkpoint_format": CHECKPOINT_FORMAT}, handle)
            if best_values is not None:
                np.savez(tmp / "best.npz", *best_values)
            swap_dir(tmp, final, check=check_checkpoint_target)  # a user's directory of that name stays
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def restore(self) -> tuple[dict, list[np.ndarray] | None] | None:
        """Loads the last checkpoint → (state, best values), or None when there is none.

        A checkpoint written for another model (other labels, features, kernel, inducing points…)
        is a ConfigError naming the checkpoint directory and the first variables that differ."""
        final = self.directory / "checkpoint"
        if not (final / "state.json").exists():
            return None
        try:
            with open(final / "state.json") as handle:
                state = json.load(handle)
            if not isinstance(state, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as error:
            raise ConfigError(f"{final}: unreadable checkpoint state ({error}); {ADVICE}") from None
        saved = state.pop("variables", None)
        written_as = state.pop("checkpoint_format", None)
        if isinstance(saved, dict):
            current = variable_shapes(self.model)
            if written_as is None and set(saved) != set(current):  # format 1's variable names
                raise ConfigError(
                    f"{self.directory}: the checkpoint was written by an older gpseq (checkpoint format 1, "
                    "before its single Trainer and composed model) and cannot be resumed by this one; train "
                    "without --resume to start afresh (or use another --checkpoint-dir)"
                )
            differences = [
                f"{name} {saved.get(name, 'absent')} in the checkpoint, {current.get(name, 'absent')} now"
                for name in sorted(set(saved) | set(current)) if saved.get(name) != current.get(name)
            ]
            if differences:
                more = f" (and {len(differences) - 2} more)" if len(differences) > 2 else ""
                raise ConfigError(
                    f"{self.directory}: the checkpoint was written for another model configuration or "
                    f"corpus: {'; '.join(differences[:2])}{more}; {ADVICE}"
                )
        try:
            self._checkpoint.read(str(final / "ckpt")).assert_consumed()
        except (ValueError, AssertionError, tf.errors.OpError) as error:
            detail = " ".join(str(error).split())[:300]
            raise ConfigError(
                f"{self.directory}: the checkpoint does not match this model configuration or corpus "
                f"({detail}); {ADVICE}"
            ) from None
        state.pop("best_values", None)
        best = None
        if (final / "best.npz").exists():
            with np.load(final / "best.npz", allow_pickle=False) as arrays:
                best = [arrays[f"arr_{i}"] for i in range(len(arrays.files))]
        return state, best
