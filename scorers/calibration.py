"""LLM-Rubric's calibration network: judge-LLM answer distributions in, each human judge's answer distribution out.

Hashemi et al. (ACL 2024), §2:

    z1 = σ((W1 + W1ᵃ)[1; x])
    z2 = σ((W2 + W2ᵃ)[1; z1])
    p̂ₐ(yᵢ) = softmax((Vᵢ + Vᵢᵃ)[1; z2])

``x`` concatenates the LLM's (unrenormalised) probability vectors for every
rubric question; W, V are shared by all human judges, Wᵃ, Vᵃ belong to judge
a. Training maximises the likelihood of (conversation, question, judge,
answer) tuples: first on all questions (pre-training), then on the main
question only (fine-tuning). Answers coded 0 (not applicable) are not tuples.

Choices this implementation makes where the paper leaves room (all are
constructor hyperparameters, chosen by `select_hyperparameters`, except the
initialisation):

* Shared weights start Xavier-normal (the authors' release draws every weight,
  judge-specific ones included, from N(0, 1), and its real-data correlation
  swings widely between seeds).
* Judge-specific weights start at zero and may carry their own decoupled
  weight decay (``judge_weight_decay``), so that W, V alone tend to model an
  average judge: a judge unseen in training is predicted with W, V only.
* Early stopping (``early_stopping=True``) holds out ``validation_fraction`` of
  the training *conversations*, tracks the held-out loss of the phase (all
  questions while pre-training, the main question while fine-tuning) each
  epoch and restores the best weights; epochs are then maxima.
* ``n_members`` > 1 trains that many networks from different seeds (and
  different validation splits) and predicts the mean of their distributions.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save
from torch import nn
from torch.nn import functional as F

from scorers.calibrators import (
    METADATA_FILE,
    NETWORK_FORMAT,
    VERSION_HEX_CHARS,
    CalibrationError,
    CalibrationFileError,
    Prediction,
    require_answers,
)
from scorers.datasets.llm_rubric import RubricData
from scorers.judges.base import Judgement

FORMAT_VERSION = 1
WEIGHTS_FILE = "weights.safetensors"
# The network is tiny: intra-op parallelism costs more than it gains (a fit measured 1.6 s on one
# thread vs 31 s on two threads of a busy 2-core machine), and one thread keeps results identical
# across machines. Training and prediction run with this many torch threads, then restore the setting.
TORCH_THREADS = 1
EARLY_STOPPING_MIN_DELTA = 1e-6  # a held-out loss must drop by more than this to count as better


@dataclass(frozen=True)
class TrainingProgress:
    """One finished (or skipped, after early stopping) epoch; ``step``/``total`` drive a progress bar."""

    step: int
    total: int
    member: int
    phase: str  # "pretrain" or "finetune"
    epoch: int
    train_loss: float
    validation_loss: float | None


ProgressCallback = Callable[[TrainingProgress], None]


# ---------------------------------------------------------------------------
# the torch module


class _Network(nn.Module):
    """One calibration network; judge index -1 means "unknown judge": shared weights only."""

    option_mask: torch.Tensor  # a buffer (register_buffer in __init__)

    def __init__(self, input_size: int, h1: int, h2: int, n_judges: int, option_counts: Sequence[int]) -> None:
        super().__init__()
        n_questions, k_max = len(option_counts), max(option_counts)
        self.W1 = nn.Parameter(torch.empty(input_size + 1, h1))
        self.W2 = nn.Parameter(torch.empty(h1 + 1, h2))
        self.V = nn.Parameter(torch.empty(n_questions, h2 + 1, k_max))
        self.W1a = nn.Parameter(torch.zeros(n_judges, input_size + 1, h1))
        self.W2a = nn.Parameter(torch.zeros(n_judges, h1 + 1, h2))
        self.Va = nn.Parameter(torch.zeros(n_judges, n_questions, h2 + 1, k_max))
        mask = torch.zeros(n_questions, k_max, dtype=torch.bool)
        for q, k in enumerate(option_counts):
            mask[q, :k] = True
        self.register_buffer("option_mask", mask)

    def reset_parameters(self, generator: torch.Generator) -> None:
        for w in (self.W1, self.W2):
            nn.init.xavier_normal_(w, generator=generator)
        for q in range(self.V.shape[0]):
            nn.init.xavier_normal_(self.V.data[q], generator=generator)
        for w in (self.W1a, self.W2a, self.Va):
            nn.init.zeros_(w)

    def shared_parameters(self) -> list[nn.Parameter]:
        return [self.W1, self.W2, self.V]

    def judge_parameters(self) -> list[nn.Parameter]:
        return [self.W1a, self.W2a, self.Va]

    def forward(self, x: torch.Tensor, judge: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, questions, max options)``; options a question lacks are -inf."""
        ones = torch.ones(x.shape[0], 1, dtype=x.dtype)
        # Row b's judge-specific term a[b] @ Wᵃ[judge[b]] as one dense matmul: (onehot ⊗ a) @ stacked Wᵃ.
        # An unknown judge (-1) has an all-zero one-hot row, so only the shared weights act.
        onehot = F.one_hot(judge.clamp(min=0), self.W1a.shape[0]).to(x.dtype) * (judge >= 0).to(x.dtype)[:, None]

        def judged(a: torch.Tensor, wa: torch.Tensor) -> torch.Tensor:
            return (onehot[:, :, None] * a[:, None, :]).reshape(a.shape[0], -1) @ wa.reshape(-1, *wa.shape[2:]).flatten(1)

        a0 = torch.cat([ones, x], dim=1)
        z1 = torch.sigmoid(a0 @ self.W1 + judged(a0, self.W1a))
        a1 = torch.cat([ones, z1], dim=1)
        z2 = torch.sigmoid(a1 @ self.W2 + judged(a1, self.W2a))
        a2 = torch.cat([ones, z2], dim=1)
        n_q, _, k_max = self.V.shape
        shared = torch.einsum("bi,qik->bqk", a2, self.V)
        # Va is (judges, questions, h2 + 1, options): bring h2 + 1 next to the judge axis first.
        per_judge = judged(a2, self.Va.permute(0, 2, 1, 3)).reshape(-1, n_q, k_max)
        return (shared + per_judge).masked_fill(~self.option_mask, float("-inf"))


def _nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood over observed entries (targets -1 are not labels)."""
    observed = targets >= 0
    if not bool(observed.any()):
        return logits.sum() * 0.0
    log_p = torch.log_softmax(logits[observed], dim=-1)
    return F.nll_loss(log_p, targets[observed])


# ---------------------------------------------------------------------------
# encoded training data


@dataclass(frozen=True)
class _Rows:
    """Tuples packed by (conversation, judge): one row per pair, one target column per question."""

    text_ids: tuple[str, ...]
    x: torch.Tensor  # (rows, input) float32
    judge: torch.Tensor  # (rows,) int64, -1 = unknown
    targets: torch.Tensor  # (rows, questions) int64, answer - 1, -1 = no label

    def take(self, idx: np.ndarray) -> _Rows:
        t = torch.as_tensor(idx, dtype=torch.long)
        return _Rows(tuple(self.text_ids[i] for i in idx), self.x[t], self.judge[t], self.targets[t])

    def __len__(self) -> int:
        return len(self.text_ids)


@contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    previous = torch.get_num_threads()
    if previous != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if previous != n:
            torch.set_num_threads(previous)


def _seed_for(seed: int, *stream: int) -> int:
    return int(np.random.SeedSequence([seed, *stream]).generate_state(1)[0])


# ---------------------------------------------------------------------------
# the estimator


class CalibrationNetwork:
    """LLM-Rubric's personalised calibration network, scikit-learn style.

    Hyperparameters are plain data given to the constructor; ``fit(data)``
    learns from a `RubricData`; ``predict_proba(x, question, judge)`` returns a
    `Prediction`. ``save(dir)`` / ``CalibrationNetwork.load(dir)`` persist it.
    """

    def __init__(
        self,
        *,
        h1: int = 25,
        h2: int = 25,
        batch_size: int = 64,
        learning_rate: float = 1e-3,
        pretrain_epochs: int = 20,
        finetune_epochs: int = 30,
        main_question: str = "Q0",
        input_questions: Sequence[str] | None = None,
        weight_decay: float = 0.0,
        judge_weight_decay: float = 0.0,
        early_stopping: bool = False,
        validation_fraction: float = 0.2,
        patience: int = 10,
        n_members: int = 1,
        seed: int = 0,
    ) -> None:
        self.h1 = h1
        self.h2 = h2
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.pretrain_epochs = pretrain_epochs
        self.finetune_epochs = finetune_epochs
        self.main_question = main_question
        self.input_questions = None if input_questions is None else tuple(input_questions)
        self.weight_decay = weight_decay
        self.judge_weight_decay = judge_weight_decay
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.patience = patience
        self.n_members = n_members
        self.seed = seed
        self._check_params()
        self._members: list[_Network] = []

    # -- parameters ---------------------------------------------------------

    PARAM_NAMES = (
        "h1", "h2", "batch_size", "learning_rate", "pretrain_epochs", "finetune_epochs", "main_question",
        "input_questions", "weight_decay", "judge_weight_decay", "early_stopping", "validation_fraction",
        "patience", "n_members", "seed",
    )  # fmt: skip

    def get_params(self) -> dict[str, Any]:
        """Constructor arguments as plain JSON-able data."""
        out = {name: getattr(self, name) for name in self.PARAM_NAMES}
        if out["input_questions"] is not None:
            out["input_questions"] = list(out["input_questions"])
        return out

    def clone(self, **overrides: Any) -> CalibrationNetwork:
        """A new, unfitted network with these hyperparameters changed."""
        unknown = set(overrides) - set(self.PARAM_NAMES)
        if unknown:
            raise CalibrationError(f"unknown hyperparameters {sorted(unknown)}")
        return CalibrationNetwork(**{**self.get_params(), **overrides})

    def _check_params(self) -> None:
        positive = ("h1", "h2", "batch_size", "n_members", "patience")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise CalibrationError(f"{name} must be a positive integer, got {value!r}")
        for name in ("pretrain_epochs", "finetune_epochs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise CalibrationError(f"{name} must be an integer >= 0, got {value!r}")
        if not (isinstance(self.learning_rate, (int, float)) and self.learning_rate > 0):
            raise CalibrationError(f"learning_rate must be > 0, got {self.learning_rate!r}")
        for name in ("weight_decay", "judge_weight_decay"):
            if getattr(self, name) < 0:
                raise CalibrationError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0 < self.validation_fraction < 1:
            raise CalibrationError(f"validation_fraction must be in (0, 1), got {self.validation_fraction!r}")

    # -- fitted state -------------------------------------------------------

    @property
    def is_fitted(self) -> bool:
        return bool(self._members)

    def _require_fitted(self) -> None:
        if not self.is_fitted:
            raise CalibrationError("the calibration network is not fitted; call fit() or load()")

    def _setup(self, question_ids: Sequence[str], n_options: Mapping[str, int], judges: Sequence[str]) -> None:
        self.question_ids_ = tuple(question_ids)
        self.n_options_ = {q: int(n_options[q]) for q in self.question_ids_}
        if self.main_question not in self.n_options_:
            raise CalibrationError(f"main_question {self.main_question!r} is not one of {self.question_ids_}")
        inputs = self.input_questions if self.input_questions is not None else self.question_ids_
        unknown = [q for q in inputs if q not in self.n_options_]
        if unknown:
            raise CalibrationError(f"input_questions {unknown} are not among the data's questions {self.question_ids_}")
        offsets, pos = {}, 0
        for q in self.question_ids_:
            offsets[q] = pos
            pos += self.n_options_[q]
        self.input_size_ = pos
        self._input_columns = np.concatenate([np.arange(offsets[q], offsets[q] + self.n_options_[q]) for q in inputs]).astype(
            np.int64
        )
        self.judges_ = tuple(judges)
        self._judge_index = {j: i for i, j in enumerate(self.judges_)}

    def _new_network(self) -> _Network:
        return _Network(
            input_size=len(self._input_columns),
            h1=self.h1,
            h2=self.h2,
            n_judges=max(len(self.judges_), 1),
            option_counts=[self.n_options_[q] for q in self.question_ids_],
        )

    # -- training -----------------------------------------------------------

    def _encode(self, data: RubricData) -> _Rows:
        qpos = {q: i for i, q in enumerate(self.question_ids_)}
        rows: dict[tuple[str, str], list[dict[int, int]]] = {}
        for lab in data.labels:
            slots = rows.setdefault((lab.text_id, lab.judge), [])
            col = qpos[lab.question]
            for slot in slots:  # a judge answering the same question twice gets a second row
                if col not in slot:
                    slot[col] = lab.answer - 1
                    break
            else:
                slots.append({col: lab.answer - 1})
        keys = [(key, slot) for key, slots in rows.items() for slot in slots]
        targets = torch.full((len(keys), len(self.question_ids_)), -1, dtype=torch.long)
        for r, (_, slot) in enumerate(keys):
            for col, y in slot.items():
                targets[r, col] = y
        text_ids = tuple(k[0] for k, _ in keys)
        x = self._features(np.stack([np.asarray(data.features[t], dtype=np.float64) for t in text_ids]))
        judge = torch.tensor([self._judge_index.get(k[1], -1) for k, _ in keys], dtype=torch.long)
        return _Rows(text_ids, x, judge, targets)

    def _features(self, x: np.ndarray) -> torch.Tensor:
        if x.ndim != 2 or x.shape[1] != self.input_size_:
            raise CalibrationError(
                f"features must have {self.input_size_} columns ({'+'.join(str(self.n_options_[q]) for q in self.question_ids_)}"
                f" options of {', '.join(self.question_ids_)}); got shape {x.shape}"
            )
        if not np.all(np.isfinite(x)):
            raise CalibrationError("features must be finite")
        return torch.as_tensor(x[:, self._input_columns], dtype=torch.float32)

    def fit(self, data: RubricData, progress: ProgressCallback | None = None) -> CalibrationNetwork:
        """Train on ``data``'s label tuples: pre-train on all questions, fine-tune on ``main_question``."""
        if not data.labels:
            raise CalibrationError("no labels to train on")
        self._setup(data.question_ids, data.n_options, data.judges)
        if not data.labels_for(self.main_question):
            raise CalibrationError(f"no labels for the main question {self.main_question!r}")
        rows = self._encode(data)
        main_col = self.question_ids_.index(self.main_question)
        total = self.n_members * (self.pretrain_epochs + self.finetune_epochs)
        self.history_: list[dict[str, list[float]]] = []
        members = []
        with _torch_threads(TORCH_THREADS):
            for m in range(self.n_members):
                net, history = self._fit_member(rows, main_col, m, total, progress)
                members.append(net)
                self.history_.append(history)
        self._members = members
        self.training_data_hash_ = data.content_hash()
        self.version_ = self._compute_version()
        return self

    def _fit_member(
        self, rows: _Rows, main_col: int, member: int, total: int, progress: ProgressCallback | None
    ) -> tuple[_Network, dict[str, list[float]]]:
        generator = torch.Generator().manual_seed(_seed_for(self.seed, member, 0))
        net = self._new_network()
        net.reset_parameters(generator)
        train, valid = rows, None
        if self.early_stopping:
            train, valid = self._split_validation(rows, _seed_for(self.seed, member, 1))
        optimizer = torch.optim.AdamW(
            [
                {"params": net.shared_parameters(), "weight_decay": self.weight_decay},
                {"params": net.judge_parameters(), "weight_decay": self.judge_weight_decay},
            ],
            lr=self.learning_rate,
        )
        history: dict[str, list[float]] = {}
        step0 = member * (self.pretrain_epochs + self.finetune_epochs)
        for phase, col, epochs in (("pretrain", None, self.pretrain_epochs), ("finetune", main_col, self.finetune_epochs)):
            phase_train = train if col is None else _only_question(train, col)
            phase_valid = None if valid is None else (valid if col is None else _only_question(valid, col))

            def report(epoch: int, train_loss: float, val_loss: float | None, phase: str = phase, step0: int = step0) -> None:
                if progress is not None:
                    progress(TrainingProgress(step0 + epoch, total, member, phase, epoch, train_loss, val_loss))

            history[phase], history[phase + "_val"] = self._train_phase(
                net, optimizer, phase_train, phase_valid, epochs, generator, report
            )
            step0 += epochs
        net.eval()
        return net, history

    def _train_phase(
        self,
        net: _Network,
        optimizer: torch.optim.Optimizer,
        train: _Rows,
        valid: _Rows | None,
        epochs: int,
        generator: torch.Generator,
        report: Callable[[int, float, float | None], None],
    ) -> tuple[list[float], list[float]]:
        """Up to ``epochs`` epochs; with a validation set, stop after ``patience`` epochs without
        improvement and restore the best weights. Returns the train and validation loss curves."""
        train_curve: list[float] = []
        val_curve: list[float] = []
        if len(train) == 0 or epochs == 0:
            return train_curve, val_curve
        valid = valid if valid is not None and len(valid) else None
        best_loss, best_state, since_best = math.inf, None, 0
        train_loss, val_loss = math.nan, None
        for epoch in range(1, epochs + 1):
            train_loss = self._epoch(net, optimizer, train, generator)
            train_curve.append(train_loss)
            if valid is not None:
                with torch.no_grad():
                    val_loss = float(_nll(net(valid.x, valid.judge), valid.targets))
                val_curve.append(val_loss)
            report(epoch, train_loss, val_loss)
            if valid is None:
                continue
            assert val_loss is not None  # computed above whenever there is a validation set
            if val_loss < best_loss - EARLY_STOPPING_MIN_DELTA:
                best_loss, since_best = val_loss, 0
                best_state = {k: v.detach().clone() for k, v in net.state_dict().items()}
            else:
                since_best += 1
                if since_best >= self.patience:
                    report(epochs, train_loss, val_loss)  # the skipped epochs count as done
                    break
        if best_state is not None:
            net.load_state_dict(best_state)
        return train_curve, val_curve

    def _split_validation(self, rows: _Rows, seed: int) -> tuple[_Rows, _Rows]:
        conversations = sorted(set(rows.text_ids))
        rng = np.random.default_rng(seed)
        n_valid = max(1, int(round(self.validation_fraction * len(conversations))))
        if n_valid >= len(conversations):
            raise CalibrationError("too few conversations to hold some out for early stopping")
        held = set(rng.permutation(conversations)[:n_valid].tolist())
        in_valid = np.array([t in held for t in rows.text_ids])
        return rows.take(np.flatnonzero(~in_valid)), rows.take(np.flatnonzero(in_valid))

    def _epoch(self, net: _Network, optimizer: torch.optim.Optimizer, rows: _Rows, generator: torch.Generator) -> float:
        net.train()
        order = torch.randperm(len(rows), generator=generator)
        total, count = 0.0, 0
        for start in range(0, len(rows), self.batch_size):
            idx = order[start : start + self.batch_size]
            targets = rows.targets[idx]
            loss = _nll(net(rows.x[idx], rows.judge[idx]), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            n = int((targets >= 0).sum())
            total += float(loss.detach()) * n
            count += n
        net.eval()
        return total / max(count, 1)

    # -- prediction ---------------------------------------------------------

    def _judge_indices(self, judge: str | None | Sequence[str | None], n: int) -> torch.Tensor:
        if judge is None or isinstance(judge, str):
            judges = [judge] * n
        else:
            judges = list(judge)
            if len(judges) != n:
                raise CalibrationError(f"got {len(judges)} judges for {n} rows of features")
        return torch.tensor([self._judge_index.get(j, -1) if j is not None else -1 for j in judges], dtype=torch.long)

    def _question_column(self, question: str) -> int:
        if question not in self.n_options_:
            raise CalibrationError(f"unknown question {question!r}; the calibrator predicts {self.question_ids_}")
        return self.question_ids_.index(question)

    def predict_proba(
        self, x: ArrayLike, question: str | None = None, judge: str | None | Sequence[str | None] = None
    ) -> Prediction:
        """Predicted distribution of ``judge``'s answer to ``question`` (default: the main question).

        ``x`` is one feature vector or a ``(n, input_size)`` array; ``judge`` is
        one judge id for all rows, one per row, or None. A judge not seen in
        training (or None) is predicted with the shared weights only.
        """
        self._require_fitted()
        question = question or self.main_question
        col = self._question_column(question)
        arr = np.asarray(x, dtype=np.float64)
        feats = self._features(arr[None, :] if arr.ndim == 1 else arr)
        judges = self._judge_indices(judge, feats.shape[0])
        k = self.n_options_[question]
        with torch.no_grad(), _torch_threads(TORCH_THREADS):
            probs = torch.stack([torch.softmax(net(feats, judges)[:, col, :k], dim=-1) for net in self._members]).mean(0)
        return Prediction(question, probs.double().numpy(), np.arange(1, k + 1, dtype=np.float64))

    def predict_all(self, x: ArrayLike, judge: str | None | Sequence[str | None] = None) -> dict[str, Prediction]:
        """Every question's prediction from one forward pass per member (equal to `predict_proba` per question)."""
        self._require_fitted()
        arr = np.asarray(x, dtype=np.float64)
        feats = self._features(arr[None, :] if arr.ndim == 1 else arr)
        judges = self._judge_indices(judge, feats.shape[0])
        with torch.no_grad(), _torch_threads(TORCH_THREADS):
            # Options a question lacks have -inf logits, so softmax over all slots gives them 0.
            probs = torch.stack([torch.softmax(net(feats, judges), dim=-1) for net in self._members]).mean(0).double().numpy()
        return {
            q: Prediction(q, probs[:, col, : self.n_options_[q]], np.arange(1, self.n_options_[q] + 1, dtype=np.float64))
            for col, q in enumerate(self.question_ids_)
        }

    def features_from_judgement(self, judgement: Judgement) -> np.ndarray:
        """``x`` for one conversation from a judge's `Judgement` (questions in the calibrator's order)."""
        self._require_fitted()
        require_answers(judgement, self.question_ids_)
        return np.asarray(judgement.probability_vector(self.question_ids_, self.n_options_), dtype=np.float64)

    def predict_judgement(
        self,
        judgement: Judgement,
        judges: Sequence[str] | None = None,
        questions: Sequence[str] | None = None,
    ) -> dict[str, Prediction]:
        """Per-question predictions for one judged conversation (one row each): `predict_judgements` of one."""
        return self.predict_judgements([judgement], judges, questions)

    def predict_judgements(
        self,
        judgements: Sequence[Judgement],
        judges: Sequence[str] | None = None,
        questions: Sequence[str] | None = None,
    ) -> dict[str, Prediction]:
        """Per-question predictions for judged conversations, row i for ``judgements[i]``.

        With ``judges`` the predictions aggregate over that trusted set;
        without, they use the shared (judge-independent) weights.
        """
        if not judgements:
            raise CalibrationError("no judgements to predict")
        x = np.stack([self.features_from_judgement(j) for j in judgements])
        wanted = list(questions or self.question_ids_)
        for q in wanted:
            self._question_column(q)
        if not judges:
            every = self.predict_all(x)
            return {q: every[q] for q in wanted}
        unknown = [j for j in judges if j not in self._judge_index]
        if unknown:
            raise CalibrationError(f"judges {unknown} were not in the training data; known: {self.judges_}")
        parts = [self.predict_all(x, j) for j in judges]
        return {q: Prediction(q, np.mean([p[q].probabilities for p in parts], axis=0), parts[0][q].values) for q in wanted}

    # -- persistence --------------------------------------------------------

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        return {
            f"member{m}.{name}": t.detach().contiguous()
            for m, net in enumerate(self._members)
            for name, t in net.state_dict().items()
        }

    def _metadata(self) -> dict[str, Any]:
        return {
            "format": NETWORK_FORMAT,
            "format_version": FORMAT_VERSION,
            "question_ids": list(self.question_ids_),
            "n_options": dict(self.n_options_),
            "main_question": self.main_question,
            "judges": list(self.judges_),
            "hyperparameters": self.get_params(),
            "training_data_hash": self.training_data_hash_,
        }

    def _weights_bytes(self) -> bytes:
        return safetensors_save(self._state_tensors())

    def _compute_version(self) -> str:
        meta = json.dumps(self._metadata(), sort_keys=True).encode()
        digest = hashlib.sha256(meta)
        for name, t in sorted(self._state_tensors().items()):
            digest.update(name.encode())
            digest.update(t.numpy().tobytes())
        return digest.hexdigest()[:VERSION_HEX_CHARS]

    def save(self, path: str | Path) -> Path:
        """Write ``weights.safetensors`` and ``calibrator.json`` into directory ``path``."""
        self._require_fitted()
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        weights = self._weights_bytes()
        meta = {**self._metadata(), "weights_sha256": hashlib.sha256(weights).hexdigest(), "version": self.version_}
        (path / WEIGHTS_FILE).write_bytes(weights)
        (path / METADATA_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> CalibrationNetwork:
        """Load a calibrator saved by `save`; any mismatch raises `CalibrationFileError`."""
        path = Path(path)
        meta_path, weights_path = path / METADATA_FILE, path / WEIGHTS_FILE
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            weights = weights_path.read_bytes()
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CalibrationFileError(f"{path}: cannot read calibrator: {e}") from e
        if not isinstance(meta, dict) or meta.get("format") != NETWORK_FORMAT:
            raise CalibrationFileError(f"{meta_path}: not a {NETWORK_FORMAT} file")
        if meta.get("format_version") != FORMAT_VERSION:
            raise CalibrationFileError(f"{meta_path}: format_version {meta.get('format_version')!r}, expected {FORMAT_VERSION}")
        required = ("question_ids", "n_options", "judges", "hyperparameters", "training_data_hash", "weights_sha256", "version")
        missing = [k for k in required if k not in meta]
        if missing:
            raise CalibrationFileError(f"{meta_path}: missing fields {missing}")
        if hashlib.sha256(weights).hexdigest() != meta["weights_sha256"]:
            raise CalibrationFileError(f"{weights_path}: SHA-256 does not match calibrator.json (corrupted or swapped file)")
        try:
            model = cls(**meta["hyperparameters"])
            model._setup(meta["question_ids"], meta["n_options"], meta["judges"])
        except (TypeError, CalibrationError, KeyError) as e:
            raise CalibrationFileError(f"{meta_path}: inconsistent metadata: {e}") from e
        try:
            tensors = safetensors_load(weights)
        except Exception as e:  # safetensors raises its own error types
            raise CalibrationFileError(f"{weights_path}: cannot parse weights: {e}") from e
        members = []
        for m in range(model.n_members):
            net = model._new_network()
            prefix = f"member{m}."
            state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            try:
                net.load_state_dict(state, strict=True)
            except RuntimeError as e:
                raise CalibrationFileError(f"{weights_path}: weights do not fit the metadata's shapes: {e}") from e
            net.eval()
            members.append(net)
        extra = [k for k in tensors if not any(k.startswith(f"member{m}.") for m in range(model.n_members))]
        if extra:
            raise CalibrationFileError(f"{weights_path}: unexpected tensors {extra[:5]}")
        model._members = members
        model.training_data_hash_ = meta["training_data_hash"]
        model.version_ = model._compute_version()
        if model.version_ != meta["version"]:
            raise CalibrationFileError(f"{meta_path}: version {meta['version']!r} does not match its content ({model.version_})")
        return model


def _only_question(rows: _Rows, col: int) -> _Rows:
    """Rows that label question ``col``, with every other question's target removed."""
    keep = np.flatnonzero((rows.targets[:, col] >= 0).numpy())
    sub = rows.take(keep)
    targets = torch.full_like(sub.targets, -1)
    targets[:, col] = sub.targets[:, col]
    return _Rows(sub.text_ids, sub.x, sub.judge, targets)
