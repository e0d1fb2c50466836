"""The training modes in one table: how tool calls are answered, which roles train, and which
model trains each. Config checks and help, the trainer, the rollout engine, the reports and the
dashboard all read it; nothing else spells a mode out.

    from envace.core.modes import training_mode
    m = training_mode("split")
    m.rollout                  # 'rehearse': the rollout engine's mode (who answers tool calls)
    m.trains                   # (('act', 'policy'), ('rehearse', 'world_model'))
    m.models()                 # {'policy': ('act',), 'world_model': ('rehearse',)}
    m.world_learner            # 'world_model': the model real_obs_coef trains

A training mode (``mode`` in a TrainConfig and a run's config.yaml) is one of ``TRAINING_MODES``;
a rollout mode (``RolloutConfig.mode``, ``envace rollout --mode``, a trajectory's ``meta.mode``)
one of ``ROLLOUT_MODES``; a trajectory's ``source`` is ``SOURCE[rollout mode]``
(docs/spec/trajectory.md). Roles are the token roles the loss trains: ``act`` (the assistant's
messages) and ``rehearse`` (tool responses the model writes itself). Torch-free, imports nothing
from envace.
"""

from __future__ import annotations

from dataclasses import dataclass

# rollout mode -> who answers the policy's tool calls
ROLLOUT_MODES: dict[str, str] = {
    "rehearse": "the policy itself (or a separate world model) writes the responses",
    "real": "the real environment executes the calls",
    "simulator": "a frozen model or an endpoint writes the responses",
}
# rollout mode -> the `source` of the trajectories it writes (docs/spec/trajectory.md)
SOURCE: dict[str, str] = {"rehearse": "rehearsal", "real": "real", "simulator": "simulator"}
ROLES = ("act", "rehearse")
MODELS = ("policy", "world_model")


@dataclass(frozen=True)
class TrainingMode:
    """One training mode: its rollout mode, the (role, model) pairs it trains, one line of help."""

    name: str
    rollout: str
    trains: tuple[tuple[str, str], ...]
    help: str

    def roles(self) -> tuple[str, ...]:
        """The roles this mode trains, in ``ROLES`` order."""
        return tuple(role for role, _ in self.trains)

    def models(self) -> dict[str, tuple[str, ...]]:
        """Trained model -> the roles it trains (policy first)."""
        out: dict[str, tuple[str, ...]] = {}
        for role, model in self.trains:
            out[model] = (*out.get(model, ()), role)
        return out

    @property
    def trains_rehearsals(self) -> bool:
        """Whether the loss trains rehearsed tool responses (then a fidelity bonus applies)."""
        return "rehearse" in self.roles()

    @property
    def world_learner(self) -> str:
        """The model that learns the world: the one training the rehearse role, else the policy
        (``real_obs_coef``'s supervised loss on real tool responses trains it)."""
        return dict((role, model) for role, model in self.trains).get("rehearse", "policy")

    @property
    def separate_world_model(self) -> bool:
        """Whether a second model (``world_model``) writes and learns the rehearsals."""
        return "world_model" in self.models()


TRAINING_MODES: dict[str, TrainingMode] = {m.name: m for m in (
    TrainingMode("envace", "rehearse", (("act", "policy"), ("rehearse", "policy")),
                 "one policy acts and rehearses (the method)"),
    TrainingMode("split", "rehearse", (("act", "policy"), ("rehearse", "world_model")),
                 "separate actor and world model"),
    TrainingMode("simulator", "simulator", (("act", "policy"),),
                 "responses from simulator_model, actor trained only"),
    TrainingMode("grpo", "real", (("act", "policy"),),
                 "standard GRPO with the real environment in the loop (the paper's baseline)"),
)}


def training_mode(name: str) -> TrainingMode:
    """The table's entry for a training mode; ValueError naming the valid ones otherwise."""
    if name not in TRAINING_MODES:
        raise ValueError(f"unknown training mode {name!r}; valid: {', '.join(TRAINING_MODES)}")
    return TRAINING_MODES[name]


def modes_help() -> str:
    """``name: help`` for every training mode, in one paragraph (the config's help for mode)."""
    return "; ".join(f"{m.name}: {m.help}" for m in TRAINING_MODES.values())


def check_rollout_mode(mode: str) -> str:
    """``mode`` if it is a rollout mode; ValueError naming the valid ones otherwise."""
    if mode not in ROLLOUT_MODES:
        raise ValueError(f"mode must be one of {tuple(ROLLOUT_MODES)}, got {mode!r}")
    return mode
