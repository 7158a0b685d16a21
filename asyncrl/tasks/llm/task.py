"""The llm task behind the roles' interface (asyncrl.tasks.base): generator actors hold a (stale) copy
of a causal LM, sample G completions per prompt, score them with the verifiable reward and write
whole prompt groups into a slot (asyncrl.tasks.llm.spec); the learner runs GRPO advantages and the
preset's loss on tokens (asyncrl.tasks.llm.learn). Weights travel as the flat float32 buffer of the
model's parameters (tied embeddings once), as the control policy's do.

The model every role starts from (:meth:`LLMTask.start_dir`): ``llm.model_dir`` or the tiny model of
``asyncrl llm prepare`` (cached in ``llm.cache_dir``), after ``llm.warmup_steps`` supervised
warm-up steps (cached beside it). :meth:`LLMTask.prepare_run` makes it before the roles start and
records the held-out accuracy before RL (``llm.eval_mode``: sampled at ``llm.temperature`` by
default, or greedy); a finished run adds the accuracy after RL (summary.json ``initial_accuracy``,
``final_accuracy``, the same evaluation with the same random draws).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asyncrl.core.metrics import strict_json
from asyncrl.core.wording import count_of
from asyncrl.tasks.base import NoPeriodicEvaluation, RolloutStats
from asyncrl.tasks.llm import gsm_answers, gsm_problems
from asyncrl.tasks.llm.defaults import DEFAULT_BATCH_SIZE
from asyncrl.tasks.llm.defaults import DEFAULT_THREADS as WARMUP_THREADS
from asyncrl.tasks.llm.spec import TokenSpec

# nothing is fetched from a hub at run time (the roles are child processes: they inherit these)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

START_FILE = "llm-start.json"  # in the run directory: the start model and its accuracy before RL
START_EVAL_FIELDS = ("initial_accuracy", "eval_problems", "initial_eval_s", "initial_correct")
WARMUP_STAMP = "asyncrl-rl-warmup.json"
WARMUP_VALIDATION = 200  # llm.warmup_target: problems after the train split, greedy accuracy checked
WARMUP_CHECK_EVERY = 100  # steps between those checks


def param_layout(model) -> list[tuple[str, torch.Tensor]]:
    """(name, parameter) of every distinct parameter (tied weights once), in module order."""
    return list(model.named_parameters())


def flat_weights(model) -> np.ndarray:
    """Every parameter as one contiguous float32 array [P] (the broadcaster's payload)."""
    return torch.cat([p.detach().reshape(-1).to(torch.float32) for _, p in param_layout(model)]).cpu().numpy()


def load_flat(model, flat: np.ndarray) -> None:
    """Inverse of :func:`flat_weights`. Raises ValueError if the size does not match."""
    params = param_layout(model)
    total = sum(p.numel() for _, p in params)
    if flat.ndim != 1 or flat.size != total:
        raise ValueError(f"flat weights have shape {flat.shape}, expected ({total},)")
    src = torch.from_numpy(np.array(flat, np.float32))  # a copy: received buffers are read-only
    off = 0
    with torch.no_grad():
        for _, p in params:
            p.copy_(src[off : off + p.numel()].view_as(p))
            off += p.numel()


def layout_hash(model) -> str:
    text = ";".join(f"{k}:{tuple(p.shape)}" for k, p in param_layout(model))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class LLMProducer:
    """A generator actor's side: the train problems, a seeded prompt stream, the sampler's torch
    generator, and a copy of the model (loaded from the start directory at :meth:`bind`, then
    overwritten by every version it is sent), float32 on ``actor.device`` (the actor's own config;
    cuda samples other tokens than cpu for the same seed). Raises ConfigError at :meth:`bind` when
    this machine lacks that device."""

    def __init__(self, task: LLMTask):
        self.task, self.cfg = task, task.cfg
        self.spec: TokenSpec = task.spec
        self.spaces = task.spaces
        self.model = self.tokenizer = None
        self.problems: list[gsm_problems.Problem] = []
        self.layout_hash, self.num_params = "", 0
        self.rng = random.Random(0)
        self.device = torch.device("cpu")
        self.gen = torch.Generator()

    def bind(self, cfg, seeds, template=None) -> None:
        from asyncrl.core.device import check_device
        from asyncrl.tasks.llm import model as m

        self.device = check_device(self.cfg.actor.device, key="actor.device")
        loaded = m.load(self.task.start_dir())
        self.model, self.tokenizer = loaded.model.to(self.device), loaded.tokenizer
        self.gen = torch.Generator(device=self.device)
        self.layout_hash = layout_hash(self.model)
        self.num_params = sum(p.numel() for _, p in param_layout(self.model))
        llm = self.cfg.llm
        if not self.problems:
            self.problems = gsm_problems.make_splits(seed=llm.model_seed, n_train=llm.train_problems, n_heldout=0).train
        self.seeds = seeds

    def load(self, flat: np.ndarray) -> None:
        load_flat(self.model, flat)

    def reset(self) -> None:
        self.rng = random.Random(int(self.seeds.env[0]))
        self.gen = torch.Generator(device=self.device).manual_seed(int(self.seeds.action))

    def collect(
        self, slot, *, version: int, guard=None, grant_id: int = 0, tick: Callable[[], None] | None = None
    ) -> RolloutStats:
        """Sample G completions for each of P prompts drawn from the train problems, score them, and
        write the slot row by row (``grant_id`` last in each row, ``guard`` asked around each)."""
        from asyncrl.tasks.llm.sampling import decode_completions, generate_group

        if guard is not None:
            grant_id = guard.grant_id
        if tick is not None:
            tick()
        if guard is not None and not guard.may_write():
            return RolloutStats(0, [], [], 0.0, 0.0, revoked=True)
        s, llm = self.spec, self.cfg.llm
        chosen = [self.problems[self.rng.randrange(len(self.problems))] for _ in range(s.prompts)]
        t0 = time.perf_counter()
        out = generate_group(
            self.model,
            self.tokenizer,
            [gsm_problems.format_prompt(p) for p in chosen],
            s.group_size,
            temperature=llm.temperature,
            max_new_tokens=s.completion_tokens,
            generator=self.gen,
        )
        out = out._replace(
            **{
                k: getattr(out, k).cpu()
                for k in ("input_ids", "attention_mask", "completion_mask", "behavior_log_prob", "policy_mask")
            }
        )
        t1 = time.perf_counter()
        texts = decode_completions(self.tokenizer, out)
        rewards = [gsm_answers.reward(text, chosen[r // s.group_size].target) for r, text in enumerate(texts)]
        if llm.truncated_reward == "zero":
            rewards = [0.0 if cut else x for x, cut in zip(rewards, truncated(out, self.tokenizer.eos_token_id))]
        if tick is not None:
            tick()
        sp, width = out.prompt_len, out.completion_mask.shape[1]
        if sp > s.prompt_tokens:
            raise ValueError(f"a prompt of {sp} tokens is longer than llm.max_prompt_tokens = {s.prompt_tokens}")
        pad = self.tokenizer.pad_token_id
        prompt_ids, prompt_mask = out.input_ids[:, :sp].numpy(), out.attention_mask[:, :sp].numpy().astype(bool)
        comp_ids, comp_mask = out.input_ids[:, sp:].numpy(), out.completion_mask.numpy()
        blp, chosen = out.behavior_log_prob.numpy(), out.policy_mask.numpy()
        lengths = []
        for r in range(s.rows):
            if guard is not None and not (guard.wrote() and guard.may_write()):
                return RolloutStats(r, rewards[:r], lengths, time.perf_counter() - t1, t1 - t0, revoked=True)
            slot["prompt_ids"][r, :] = pad
            slot["prompt_ids"][r, s.prompt_tokens - sp :] = prompt_ids[r]
            slot["prompt_mask"][r, :] = False
            slot["prompt_mask"][r, s.prompt_tokens - sp :] = prompt_mask[r]
            slot["completion_ids"][r, :] = pad
            slot["completion_ids"][r, :width] = comp_ids[r]
            slot["completion_mask"][r, :] = False
            slot["completion_mask"][r, :width] = comp_mask[r]
            slot["policy_mask"][r, :] = False
            slot["policy_mask"][r, :width] = chosen[r]
            slot["behavior_log_prob"][r, :] = 0.0
            slot["behavior_log_prob"][r, :width] = blp[r]
            slot["behavior_version"][r] = version
            slot["rewards"][r] = rewards[r]
            slot["grant_id"][r] = grant_id
            lengths.append(int(comp_mask[r].sum()))
        if guard is not None and not guard.wrote():
            return RolloutStats(s.rows, rewards, lengths, time.perf_counter() - t1, t1 - t0, revoked=True)
        return RolloutStats(s.rows, rewards, lengths, time.perf_counter() - t1, t1 - t0)

    def state_dict(self) -> dict:
        return {"source": {"prompt_rng": _rng_state(self.rng)}, "rng": self.gen.get_state()}

    def load_source_state(self, source: Any) -> bool:
        self.rng.setstate(_rng_from(source["prompt_rng"]))
        return True

    def load_rng_state(self, rng: Any) -> None:
        self.gen.set_state(rng)

    def close(self) -> None:
        self.model = None


def truncated(samples, eos_id: int) -> list[bool]:
    """Per row of ``samples`` (sampling.Samples): True when the completion never emitted ``eos_id``
    (it was cut at the generation budget)."""
    ids = samples.input_ids[:, samples.prompt_len :]
    return [not bool(((ids[r] == eos_id) & samples.completion_mask[r]).any()) for r in range(ids.shape[0])]


def _rng_state(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from(d: list) -> tuple:
    return (d[0], tuple(d[1]), d[2])


class LLMTask:
    kind = "llm"
    obs_shape: tuple[int, ...] = ()

    def __init__(self, cfg):
        self.cfg = cfg
        self._spec: TokenSpec | None = None
        self._start: Path | None = None
        self._reference = None

    # ---- the start model ----
    def base_dir(self) -> Path:
        llm = self.cfg.llm
        return Path(llm.model_dir) if llm.model_dir else Path(llm.cache_dir) / f"tiny-qwen2-s{llm.model_seed}"

    def start_dir(self) -> Path:
        """The model directory every role loads at its start: the base model, warmed up when
        llm.warmup_steps > 0 (made by :meth:`prepare_model`)."""
        llm = self.cfg.llm
        base = self.base_dir()
        if llm.warmup_steps == 0:
            return base
        target = f"-t{llm.warmup_target:g}" if llm.warmup_target else ""
        batch = f"-b{llm.warmup_batch_size}" if llm.warmup_batch_size != DEFAULT_BATCH_SIZE else ""
        threads = f"-th{llm.warmup_threads}" if llm.warmup_threads != WARMUP_THREADS else ""
        return Path(llm.cache_dir) / f"{base.name}-warm-s{llm.model_seed}-n{llm.warmup_steps}{batch}{threads}{target}"

    def prepare_model(self, echo: Callable[[str], None] = print) -> Path:
        """Make (or reuse) the start model: ``asyncrl llm prepare``'s tiny model when llm.model_dir is
        '', then llm.warmup_steps of :func:`asyncrl.tasks.llm.warmup.warmup` with its defaults
        (cached, keyed by the settings). Raises model.ModelLoadError for a missing llm.model_dir."""
        from asyncrl.tasks.llm import model as m
        from asyncrl.tasks.llm import warmup as w

        llm = self.cfg.llm
        if not llm.model_dir:
            path, reused = m.prepare(self.base_dir(), seed=llm.model_seed)
            echo(f"llm: {'reused' if reused else 'prepared'} the tiny model {path}")
        start = self.start_dir()
        if llm.warmup_steps == 0:
            m.load(start)  # one line if it is not a model directory
            return start
        settings = {
            "base": str(self.base_dir().resolve()),
            "seed": llm.model_seed,
            "steps": llm.warmup_steps,
            "train_problems": llm.train_problems,
            "generator_version": gsm_problems.GENERATOR_VERSION,
            "calculator_mask": True,
        }
        if llm.warmup_batch_size != DEFAULT_BATCH_SIZE:
            settings["batch_size"] = llm.warmup_batch_size
        if llm.warmup_threads != WARMUP_THREADS:
            settings["threads"] = llm.warmup_threads
        if llm.warmup_target:
            settings.update(
                target=llm.warmup_target, validation_problems=WARMUP_VALIDATION, check_every=WARMUP_CHECK_EVERY
            )
        try:
            stamp = json.loads((start / WARMUP_STAMP).read_text())
            # a cache made before llm.warmup_threads existed ran at whatever torch had: it counts only if that matched
            if stamp["settings"] == settings and (
                not llm.warmup_threads or stamp["torch_threads"] == llm.warmup_threads
            ):
                echo(f"llm: reused the warmed-up model {start}")
                return start
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if start.exists():
            raise FileExistsError(f"{start} exists and was not warmed up with these settings; remove it")
        loaded = m.load(self.base_dir())
        n_val = WARMUP_VALIDATION if llm.warmup_target else 0
        problems = gsm_problems.make_splits(seed=llm.model_seed, n_train=llm.train_problems + n_val, n_heldout=0).train
        train, validation = problems[: llm.train_problems], problems[llm.train_problems :]
        checks: list[tuple[int, float]] = []

        def reached(steps: int) -> bool:  # the warm-up's early stop: greedy accuracy on the validation problems
            from asyncrl.tasks.llm.sampling import evaluate

            if steps < llm.warmup_steps // 2:  # checked from half the budget on (each check costs seconds)
                return False
            loaded.model.eval()
            checks.append(
                (
                    steps,
                    evaluate(
                        loaded.model, loaded.tokenizer, validation, greedy=True, max_new_tokens=llm.max_new_tokens
                    ),
                )
            )
            loaded.model.train()
            echo(f"llm: warm-up step {steps}: validation accuracy {checks[-1][1]:.3f} (target {llm.warmup_target:g})")
            return checks[-1][1] >= llm.warmup_target

        echo(
            f"llm: warming up {self.base_dir()} for {count_of(llm.warmup_steps, 'step')}"
            f"{f' or until validation accuracy {llm.warmup_target:g}' if llm.warmup_target else ''} (supervised, "
            f"cached in {start})"
        )
        threads = torch.get_num_threads()
        if llm.warmup_threads:
            torch.set_num_threads(llm.warmup_threads)
        try:
            result = w.warmup(
                loaded.model,
                loaded.tokenizer,
                train,
                steps=llm.warmup_steps,
                seed=llm.model_seed,
                calculator_mask=True,
                batch_size=llm.warmup_batch_size,
                stop=reached if llm.warmup_target else None,
                check_every=WARMUP_CHECK_EVERY,
            )
            warm_threads = torch.get_num_threads()
        finally:
            torch.set_num_threads(threads)
        tmp = start.with_name(f".{start.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        m.save(loaded.model, loaded.tokenizer, tmp)
        (tmp / WARMUP_STAMP).write_text(
            strict_json(
                {
                    "settings": settings,
                    "final_loss": result.final_loss,
                    "steps_taken": result.steps,
                    "validation_checks": checks,
                    "torch_threads": warm_threads,
                    "seconds": round(result.seconds, 2),
                },
                indent=1,
            )
            + "\n"
        )
        os.replace(tmp, start)
        echo(
            f"llm: warm-up done in {result.seconds:.0f} s, {count_of(result.steps, 'step')} (loss "
            f"{result.final_loss:.3f})"
        )
        return start

    def _model_config(self) -> dict:
        path = self.start_dir() / "config.json"
        try:
            return json.loads(path.read_text())
        except OSError:
            raise FileNotFoundError(
                f"no model at {self.start_dir()}: run `asyncrl run --config ...` (it prepares "
                f"and warms up the model first) or set llm.model_dir"
            ) from None

    # ---- the interface ----
    @property
    def id(self) -> str:
        return f"llm:{self.start_dir()}"

    @property
    def spec(self) -> TokenSpec:
        if self._spec is None:
            llm = self.cfg.llm
            self._spec = TokenSpec(
                prompts=llm.prompts_per_slot,
                group_size=llm.group_size,
                prompt_tokens=llm.max_prompt_tokens,
                completion_tokens=llm.max_new_tokens,
                vocab_size=int(self._model_config()["vocab_size"]),
            )
        return self._spec

    @property
    def spaces(self) -> dict[str, str]:
        s = self.spec
        return {
            "observation": f"prompt tokens [{s.prompt_tokens}] of a vocabulary of {s.vocab_size}",
            "action": f"completion tokens [{s.completion_tokens}] at temperature {self.cfg.llm.temperature}",
        }

    def producer(self) -> LLMProducer:
        return LLMProducer(self)

    def build_policy(self):
        from asyncrl.tasks.llm import model as m

        return m.load(self.start_dir()).model

    def reference(self):
        """The KL penalty's reference π_ref (llm.kl_coef > 0): the start model, frozen (no gradient, eval
        mode), loaded on first use, so only the learner holds it; None when llm.kl_coef = 0."""
        if self.cfg.llm.kl_coef == 0:
            return None
        if self._reference is None:
            from asyncrl.tasks.llm import model as m

            self._reference = m.load(self.start_dir()).model.requires_grad_(False).eval()
        return self._reference

    def flat_weights(self, policy) -> np.ndarray:
        return flat_weights(policy)

    def layout_hash(self, policy) -> str:
        return layout_hash(policy)

    def make_batch(self, state, slots, gaps=None) -> dict[str, torch.Tensor]:
        """Rows of B slots stacked: [B * rows, ...] tensors (groups stay whole: a slot holds whole groups)."""
        names = self.spec.batch_field_names
        return {n: torch.from_numpy(np.concatenate([arrays[n] for _, arrays in slots], axis=0)) for n in names}

    def learner_iteration(self, state, batch) -> dict[str, Any]:
        from asyncrl.tasks.llm.learn import llm_iteration

        reference = self.reference()
        if reference is not None:
            reference.to(state.device)  # in place; a no-op after the first iteration and on the CPU
        return llm_iteration(
            state.policy,
            state.optimizer,
            batch,
            algo=self.cfg.algo,
            llm=self.cfg.llm,
            generator=state.generator,
            version=state.version,
            reference=reference,
            forward_context=state.forward_context,
        )

    def after_iteration(self, state, batch) -> None:
        return None

    def evaluate(self, model) -> tuple[float, int, list[int]]:
        """(exact-match accuracy, problems, per-problem 0/1 rewards in problem order) on the first
        llm.eval_size held-out problems, one completion each (calculator on, as :func:`sampling.evaluate`).

        llm.eval_mode "sampled": at llm.temperature (the policy RL trains, and DeepSeek-R1's pass@1
        with one sample, arXiv:2501.12948) from a generator seeded with llm.model_seed, so the
        evaluations before and after RL use the same random draws (common random numbers: the paired
        interval then measures the policy's change, not the draws'); "greedy": argmax decoding.
        Runs with learner.torch_threads torch threads: torch's default of one per core took 280-310 s
        instead of about 11 s for 500 problems when other processes held the cores (lab/llm-gsm-tiny/README.md)."""
        from asyncrl.tasks.llm import model as m
        from asyncrl.tasks.llm.sampling import eval_completions

        llm = self.cfg.llm
        heldout = gsm_problems.make_splits(seed=llm.model_seed, n_train=0, n_heldout=llm.eval_size).heldout
        tokenizer = m.load(self.start_dir()).tokenizer
        greedy = llm.eval_mode == "greedy"
        device = next(model.parameters()).device  # the draws come from the model's device (cuda: its own stream)
        generator = None if greedy else torch.Generator(device=device).manual_seed(llm.model_seed)
        threads = torch.get_num_threads()
        torch.set_num_threads(self.cfg.learner.torch_threads)
        try:
            texts = eval_completions(
                model,
                tokenizer,
                heldout,
                greedy=greedy,
                temperature=llm.temperature,
                generator=generator,
                max_new_tokens=llm.max_new_tokens,
                batch_size=llm.eval_batch_size,
            )
        finally:
            torch.set_num_threads(threads)
        correct = [int(gsm_answers.reward(text, p.target)) for text, p in zip(texts, heldout)]
        return (sum(correct) / len(correct) if correct else 0.0), len(heldout), correct

    def eval_label(self) -> str:
        """ "greedy" or "sampled T=<llm.temperature>": what initial and final accuracy measure."""
        llm = self.cfg.llm
        return "greedy" if llm.eval_mode == "greedy" else f"sampled T={llm.temperature:g}"

    def periodic_eval(self) -> NoPeriodicEvaluation:
        """None during training (``run.eval_every`` is a control-task key): the llm task evaluates
        its start and final models on held-out problems instead (:meth:`final_summary`)."""
        return NoPeriodicEvaluation()

    def prepare_run(self, run_dir: Path, echo: Callable[[str], None] = print) -> dict:
        """Make the start model, then (once per run directory) its held-out accuracy before RL.
        Raises ValueError (a model directory that does not load), FileExistsError."""
        from asyncrl.tasks.llm import model as m

        try:
            start = self.prepare_model(echo)
        except m.ModelLoadError as exc:
            raise ValueError(str(exc)) from None
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        path = Path(run_dir) / START_FILE
        if path.exists():
            return json.loads(path.read_text())
        record = {
            "model": str(start),
            "initial_accuracy": None,
            "eval_problems": 0,
            "eval_mode": self.eval_label(),
            "eval_batch_size": self.cfg.llm.eval_batch_size,
        }
        if self.cfg.llm.eval_size:
            record.update(self._start_evaluation(start, echo))
            how = "reused from " + record["initial_eval_cached"] if "initial_eval_cached" in record else "measured"
            echo(
                f"llm: held-out accuracy before RL {record['initial_accuracy']:.3f} on {record['eval_problems']} "
                f"problems ({self.eval_label()}; {how})"
            )
        path.write_text(strict_json(record, indent=1) + "\n")
        return record

    def _start_evaluation(self, start: Path, echo: Callable[[str], None]) -> dict:
        """initial_accuracy, eval_problems, initial_eval_s and initial_correct of the start model; for a
        start model asyncrl made in llm.cache_dir (never for a user's own directory) reused from, or
        saved to, llm.cache_dir/start-evals/KEY.json (:meth:`start_eval_key`; adds initial_eval_cached
        when reused). A cache that cannot be written costs the next run an evaluation, nothing else."""
        from asyncrl.tasks.llm import model as m

        llm = self.cfg.llm
        cache = None
        if Path(start).resolve().is_relative_to(Path(llm.cache_dir).resolve()):
            cache = Path(llm.cache_dir) / "start-evals" / f"{self.start_eval_key(start)}.json"
            try:
                cached = json.loads(cache.read_text())
                return {k: cached[k] for k in START_EVAL_FIELDS} | {"initial_eval_cached": str(cache)}
            except (OSError, ValueError, KeyError, TypeError):
                pass
        t0 = time.perf_counter()
        acc, n, correct = self.evaluate(m.load(start).model)
        out = {
            "initial_accuracy": acc,
            "eval_problems": n,
            "initial_eval_s": round(time.perf_counter() - t0, 2),
            "initial_correct": "".join(map(str, correct)),
        }
        if cache is not None:
            try:  # one atomic file: concurrent runs write the same content
                cache.parent.mkdir(parents=True, exist_ok=True)
                tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
                tmp.write_text(strict_json(out, indent=1) + "\n")
                os.replace(tmp, cache)
            except OSError as exc:
                echo(f"llm: could not cache the start evaluation in {cache}: {exc}")
        return out

    def start_eval_key(self, start: Path) -> str:
        """Cache key (16 hex digits) of the evaluation before RL: the start model directory's files
        (name, size, modification time), the llm task's code (sampler, problems, this evaluation) and
        every setting the evaluation reads. The same key means the same computation on this machine
        (one torch thread, seeded draws), so :meth:`prepare_run` reuses its result across runs."""
        llm = self.cfg.llm
        h = hashlib.sha256()
        for f in sorted(p for p in Path(start).iterdir() if p.is_file()):
            st = f.stat()
            h.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
        for f in sorted(Path(__file__).parent.glob("*.py")):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        h.update(
            json.dumps(
                {
                    "eval_size": llm.eval_size,
                    "eval_mode": llm.eval_mode,
                    "temperature": llm.temperature,
                    "model_seed": llm.model_seed,
                    "eval_batch_size": llm.eval_batch_size,
                    "max_new_tokens": llm.max_new_tokens,
                    "threads": self.cfg.learner.torch_threads,
                    "generator_version": gsm_problems.GENERATOR_VERSION,
                    "torch": torch.__version__,
                },
                sort_keys=True,
            ).encode()
        )
        return h.hexdigest()[:16]

    def final_summary(self, policy, run_dir: Path) -> dict[str, Any]:
        """initial_accuracy (from prepare_run), final_accuracy (now, the same evaluation) and the
        difference with a 95 % normal-approximation CI that treats the two accuracies as independent
        binomial proportions on n problems (the paired evaluation would be tighter)."""
        try:
            start = json.loads((Path(run_dir) / START_FILE).read_text())
        except (OSError, ValueError):
            start = {"model": str(self.start_dir()), "initial_accuracy": None, "eval_problems": 0}
        out = {
            "task": "llm",
            "model": start["model"],
            "initial_accuracy": start["initial_accuracy"],
            "final_accuracy": None,
            "eval_problems": start["eval_problems"],
            "eval_mode": self.eval_label(),
        }
        sampled = self.cfg.llm.eval_mode == "sampled"  # its draws follow the batch: row r of a batch, step t
        if start.get("eval_mode", "greedy") != self.eval_label() or (
            sampled and start.get("eval_batch_size", 64) != self.cfg.llm.eval_batch_size
        ):  # 64: records before the key
            # a start record of another evaluation (a run directory resumed under other settings): not comparable
            out["initial_accuracy"] = start["initial_accuracy"] = start["initial_correct"] = None
        if not self.cfg.llm.eval_size:
            return out
        t0 = time.perf_counter()
        acc, n, correct = self.evaluate(policy)
        out.update(final_accuracy=acc, eval_problems=n, final_eval_s=round(time.perf_counter() - t0, 2))
        p0 = start["initial_accuracy"]
        if p0 is not None:
            half = 1.96 * math.sqrt((p0 * (1 - p0) + acc * (1 - acc)) / n)
            out["accuracy_difference"] = acc - p0
            out["accuracy_difference_ci95"] = [acc - p0 - half, acc - p0 + half]
        before = start.get("initial_correct")
        if isinstance(before, str) and len(before) == n:
            out.update(paired_difference(list(map(int, before)), correct))
        return out


def paired_difference(before: list[int], after: list[int], z: float = 1.96) -> dict[str, Any]:
    """The accuracy difference of two evaluations on the same problems, with its paired 95 % interval.

    Wald interval of a difference of paired proportions (Agresti, Categorical Data Analysis, sec.
    10.1): with b problems solved only before and c only after, d = (c - b) / n and
    var(d) = ((b + c) - (c - b)^2 / n) / n^2. Tighter than treating the two accuracies as independent
    when the same problems stay solved.

    Args:
        before, after: 0/1 per problem, the same problems in the same order.

    Returns:
        {"solved_only_before": b, "solved_only_after": c, "accuracy_difference_ci95_paired": [lo, hi]}.

    Raises:
        ValueError: lengths differ or are 0.
    """
    if len(before) != len(after) or not before:
        raise ValueError(f"paired evaluations need the same non-zero length, got {len(before)} and {len(after)}")
    n = len(before)
    b = sum(1 for x, y in zip(before, after) if x and not y)
    c = sum(1 for x, y in zip(before, after) if y and not x)
    d = (c - b) / n
    half = z * math.sqrt(max(0.0, (b + c) - (c - b) ** 2 / n)) / n
    return {"solved_only_before": b, "solved_only_after": c, "accuracy_difference_ci95_paired": [d - half, d + half]}
