"""The span-phase machine as ``megatron/training/README.md`` documents it: span names,
states, triggers, table.

Written out by hand on purpose: the lifecycle tests derive what is legal from
these, never from the module's own ``TRANSITIONS``.
"""

from __future__ import annotations

STARTUP = "megatron.startup"
TRAIN = "megatron.train"
PRE_STARTUP = "pre_startup"
LAUNCH_SCRIPT = "megatron.startup.launch_script"
CONTAINER_LOAD = "megatron.startup.container_load"
STRUCTURAL_ROOTS = frozenset({STARTUP, TRAIN})

STATES = ("job", "startup", "train", "interval", "ended", "shutdown", "terminated")
TRIGGERS = (
    "start_job",
    "record_phase",
    "start_train",
    "reroot",
    "end_train",
    "flush",
    "shutdown",
    "terminate",
    "step",
)
LIVE = ("job", "startup", "train", "interval", "ended")
#: What the training path (pretrain() and train()) fires; the exit paths fire flush
#: and terminate.
TRAINING_TRIGGERS = ("start_job", "record_phase", "start_train", "reroot", "end_train", "shutdown")

# The transition table as megatron/training/README.md documents it, written out by hand: the
# tests derive legality from this, never from the module's own TRANSITIONS.
# (state, trigger) -> destination state.  ``step`` is not in that table (it is a
# method that fires ``reroot`` on a boundary); its entries describe a lifecycle that
# has just run ``start_train`` (pass counter 0, so the first step is a boundary).
SPEC_TABLE: dict[tuple[str, str], str] = {
    # The training path: strict.
    ("job", "start_job"): "startup",
    ("startup", "record_phase"): "startup",
    ("startup", "start_train"): "train",
    # train() without pretrain(): a lifecycle of its own, no startup to end
    ("job", "start_train"): "train",
    ("train", "reroot"): "interval",
    ("interval", "reroot"): "interval",
    ("interval", "end_train"): "ended",
    # the loop ran no pass (a resume with nothing left to train)
    ("train", "end_train"): "ended",
    **{(s, "shutdown"): "shutdown" for s in LIVE},
    # The exit paths: legal everywhere, never an error.
    **{(s, "flush"): s for s in (*LIVE, "shutdown", "terminated")},
    **{(s, "terminate"): "terminated" for s in LIVE},
    ("shutdown", "terminate"): "shutdown",
    ("terminated", "terminate"): "terminated",
    # A process that outlived a terminate trains on: every trigger records nothing.
    **{("terminated", t): "terminated" for t in TRAINING_TRIGGERS},
}
STEP_TABLE: dict[tuple[str, str], str] = {
    ("train", "step"): "interval",
    ("interval", "step"): "interval",
    ("terminated", "step"): "terminated",
}
FULL_TABLE = {**SPEC_TABLE, **STEP_TABLE}

# A legal path from a fresh lifecycle to each state.
PATH_TO_STATE: dict[str, tuple[str, ...]] = {
    "job": (),
    "startup": ("start_job",),
    "train": ("start_job", "start_train"),
    "interval": ("start_job", "start_train", "reroot"),
    "ended": ("start_job", "start_train", "reroot", "end_train"),
    "shutdown": ("shutdown",),
    "terminated": ("start_job", "terminate"),
}
