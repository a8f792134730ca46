"""What Megatron-LM's ``pretrain_gpt.py`` needs to run on a CPU-only Python 3.11 machine.

Python imports ``sitecustomize`` at start-up from the first directory on
``sys.path`` that has one: :mod:`tests.support.megatron_lm` puts this
directory on ``PYTHONPATH`` and sets ``MEGATRON_LM_CPU_SHIMS=1``, so every
process of the run (``pretrain_gpt.py`` and the workers it spawns, which
re-import it) gets the same answers; without the variable this file does
nothing. Never imported by the project. It does five things, none of which
touches the Megatron-LM tree:

* ``typing.override`` exists on 3.11 (``typing_extensions``' backport), which
  two of Megatron-LM's model modules import;
* ``torch.cuda`` answers on the CPU: ``is_available()`` is true, one device,
  random-number state, streams, events and memory reports are CPU stand-ins,
  and every tensor asked for on ``cuda`` is made on the CPU (a
  ``TorchFunctionMode`` that rewrites the ``device`` a factory or ``.to()`` is
  given);
* test hooks, by variable: a ``RuntimeError`` or a signal to itself at the
  N-th ``train_step`` call, a sleep before each (a slower step), a signal
  landing inside nemo-lens's open-span closer while it holds its lock,
  packages that fail to import as if not installed, and a record, at exit, of
  which signals have a Python handler;
* NVIDIA Resiliency Extension's health check and finalize, which Megatron-LM's
  ``--inprocess-restart`` always uses, name their device by its index
  (``torch.device(int(LOCAL_RANK))``, which a CPU-only torch refuses): there, an
  index is the CPU;
* spans the OpenTelemetry SDK's ``ConsoleSpanExporter`` writes (nemo-lens's
  ``console`` exporter) go to the file ``MEGATRON_LM_SPANS_FILE`` names (``{rank}``
  in it made the process's ``RANK``, so torchrun's ranks write a file each), one
  JSON object a line, flushed per export, instead of standard output.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
import typing

# The variables tests/support/megatron_lm.py documents (spelled again here: this
# file runs before anything of the tests can be imported).
FAULT_AT = "MEGATRON_LM_TEST_FAULT_AT_STEP"
SIGNAL_AT = "MEGATRON_LM_TEST_SIGNAL_AT_STEP"
STEP_SLEEP = "MEGATRON_LM_TEST_STEP_SLEEP"
HIDE_PACKAGES = "MEGATRON_LM_TEST_HIDE_PACKAGES"
SIGNALS_FILE = "MEGATRON_LM_TEST_SIGNALS_FILE"
SIGNAL_IN_LOCK = "MEGATRON_LM_TEST_SIGNAL_IN_SPAN_CLOSER"


def _backport_override() -> None:
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override


def _is_cuda(device: object) -> bool:
    import torch

    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)


def _answer_cuda_on_cpu() -> None:
    import torch
    from torch.overrides import TorchFunctionMode

    cpu = torch.device("cpu")

    class _CudaOnCpu(TorchFunctionMode):
        """Every ``device=cuda`` (or a bare device index) becomes the CPU."""

        def __torch_function__(self, func, types_, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if _is_cuda(kwargs.get("device")):
                kwargs["device"] = cpu
            name = getattr(func, "__name__", "")
            if name == "cuda":
                return args[0]
            if name == "to":
                args = tuple(cpu if _is_cuda(a) else a for a in args)
            return func(*args, **kwargs)

    mode = _CudaOnCpu()
    mode.__enter__()  # for the whole process: it is what a CPU run needs

    cuda = torch.cuda

    class _Event:
        def __init__(self, *args, **kwargs):
            import time

            self._time = time.perf_counter
            self._at = None

        def record(self, *args, **kwargs):
            self._at = self._time()

        def synchronize(self):
            pass

        def wait(self, *args, **kwargs):
            pass

        def query(self):
            return True

        def elapsed_time(self, end):
            return ((end._at or 0.0) - (self._at or 0.0)) * 1000.0

    class _Stream:
        def __init__(self, *args, **kwargs):
            pass

        def synchronize(self):
            pass

        def wait_stream(self, *args, **kwargs):
            pass

        def wait_event(self, *args, **kwargs):
            pass

        def record_event(self, event=None):
            return event or _Event()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class _StreamContext:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    # The "CUDA" generator: a CPU generator of its own, so the state Megatron-LM
    # forks and restores for its model-parallel RNG tracker stays coherent.
    generator = torch.Generator()
    cuda.default_generators = (generator,)

    answers = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": lambda *a, **k: None,
        "synchronize": lambda *a, **k: None,
        "empty_cache": lambda: None,
        "get_rng_state": lambda *a, **k: generator.get_state(),
        "set_rng_state": lambda state, *a, **k: generator.set_state(state),
        "manual_seed": lambda seed: generator.manual_seed(seed),
        "manual_seed_all": lambda seed: generator.manual_seed(seed),
        "get_device_capability": lambda *a, **k: (8, 0),
        "get_device_name": lambda *a, **k: "cpu",
        "get_device_properties": lambda *a, **k: types.SimpleNamespace(
            name="cpu", total_memory=0, major=8, minor=0, multi_processor_count=1
        ),
        "memory_allocated": lambda *a, **k: 0,
        "max_memory_allocated": lambda *a, **k: 0,
        "memory_reserved": lambda *a, **k: 0,
        "max_memory_reserved": lambda *a, **k: 0,
        "reset_peak_memory_stats": lambda *a, **k: None,
        "memory_stats": lambda *a, **k: {},
        "mem_get_info": lambda *a, **k: (0, 0),
        "current_stream": lambda *a, **k: _Stream(),
        "default_stream": lambda *a, **k: _Stream(),
        "set_stream": lambda *a, **k: None,
        "Stream": _Stream,
        "Event": _Event,
        "stream": _StreamContext,
        "is_initialized": lambda: True,
    }
    for name, answer in answers.items():
        setattr(cuda, name, answer)
    for name in ("get_rng_state", "set_rng_state", "manual_seed", "manual_seed_all"):
        setattr(cuda.random, name, answers[name])


def _rank_path(variable: str) -> str:
    """The path ``variable`` names, ``{rank}`` in it made this process's ``RANK``."""
    return os.environ.get(variable, "").replace("{rank}", os.environ.get("RANK", "launcher"))


def _spans_to_file() -> None:
    path = _rank_path("MEGATRON_LM_SPANS_FILE")
    if not path:
        return
    from opentelemetry.sdk.trace import export

    original = export.ConsoleSpanExporter.__init__
    sink = open(path, "a", encoding="utf-8")  # noqa: SIM115 -- open for the process's life

    def __init__(self, *args, **kwargs):
        kwargs["out"] = sink
        original(self, *args, **kwargs)

    export.ConsoleSpanExporter.__init__ = __init__


class _Hidden:
    """A meta-path finder under which the named packages fail to import."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def find_spec(self, fullname, path=None, target=None):
        for name in self.names:
            if fullname == name or fullname.startswith(name + "."):
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def _hide_packages() -> None:
    names = [n.strip() for n in os.environ.get(HIDE_PACKAGES, "").split(",") if n.strip()]
    if names:
        sys.meta_path.insert(0, _Hidden(names))


def _step_hooks(module) -> None:
    """Wrap ``module.train_step`` with the fault, signal and sleep a test asked for.

    ``train()`` looks ``train_step`` up in its module's globals at every pass,
    so replacing the attribute is enough. Calls are counted in this process,
    so a resumed run counts from its own first step.
    """
    fault_at = os.environ.get(FAULT_AT)
    signal_at = os.environ.get(SIGNAL_AT)
    sleep_s = float(os.environ.get(STEP_SLEEP) or 0)
    if not (fault_at or signal_at or sleep_s):
        return
    original = module.train_step
    calls = [0]
    signal_step, signal_name = [*signal_at.split(":"), "SIGTERM"][:2] if signal_at else (0, "")

    def train_step(*args, **kwargs):
        calls[0] += 1
        if sleep_s:
            import time

            time.sleep(sleep_s)
        if signal_at and calls[0] == int(signal_step):
            import signal

            os.kill(os.getpid(), getattr(signal, signal_name))
        if fault_at and calls[0] == int(fault_at):
            raise RuntimeError(f"injected fault in train_step call {calls[0]}")
        return original(*args, **kwargs)

    module.train_step = train_step


def _signal_in_the_span_closer(module) -> None:
    """``SIGNAME:N``: the N-th span end on the main thread lands SIGNAME inside nemo-lens's
    ``_OpenSpanCloser.on_end``, while it holds its lock, as CPython runs a handler there:
    called with that frame."""
    landing = os.environ.get(SIGNAL_IN_LOCK)
    if not landing:
        return
    import signal
    import threading

    name, at = landing.split(":")
    signum, main = getattr(signal, name), threading.main_thread()

    class LandsASignal:
        ends = 0

        def __init__(self) -> None:
            self._lock = threading.Lock()

        def __enter__(self) -> None:
            self._lock.acquire()
            holder = sys._getframe(1)
            if threading.current_thread() is main and holder.f_code.co_name == "on_end":
                LandsASignal.ends += 1
                if LandsASignal.ends == int(at):
                    print(f"landing {name} inside _OpenSpanCloser.on_end", file=sys.stderr)
                    try:
                        signal.getsignal(signum)(signum, holder)
                    except BaseException:  # raised inside the with block: it releases
                        self._lock.release()
                        raise

        def __exit__(self, *exc) -> None:
            self._lock.release()

    closer = module._OpenSpanCloser
    init = closer.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._lock = LandsASignal()

    closer.__init__ = __init__


class _AfterImport:
    """A meta-path finder that runs ``hook(module)`` once ``name`` has been executed."""

    def __init__(self, name: str, hook) -> None:
        self.name = name
        self.hook = hook

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader, hook = spec.loader, self.hook
        execute = loader.exec_module

        def exec_module(module):
            execute(module)
            hook(module)

        loader.exec_module = exec_module
        return spec


def _record_signal_handlers() -> None:
    """At exit, write which terminating signals have a Python handler (JSON).

    Registered first, so it runs after every other atexit hook: what the
    process left installed. ``default``, ``ignore``, ``python`` or ``other``
    per signal.
    """
    path = _rank_path(SIGNALS_FILE)
    if not path:
        return
    import atexit
    import json
    import signal

    def record() -> None:
        kinds = {}
        for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGQUIT"):
            handler = signal.getsignal(getattr(signal, name))
            if handler == signal.SIG_DFL:
                kinds[name] = "default"
            elif handler == signal.SIG_IGN:
                kinds[name] = "ignore"
            elif callable(handler):
                kinds[name] = "python"
            else:
                kinds[name] = "other"
        with open(path, "w", encoding="utf-8") as out:
            json.dump(kinds, out)

    atexit.register(record)


class _TorchNamingTheCpu:
    """``torch`` as a module of NVRx sees it on a CPU: ``torch.device(N)``, a device by
    index (CUDA's), is the CPU, which a CPU-only torch refuses to make."""

    def __init__(self, torch) -> None:
        self._torch = torch

    def __getattr__(self, name):
        return getattr(self._torch, name)

    def device(self, *args, **kwargs):
        if args and isinstance(args[0], int) and not isinstance(args[0], bool):
            return self._torch.device("cpu")
        return self._torch.device(*args, **kwargs)


def _nvrx_devices_on_cpu(module) -> None:
    """NVRx's ``CudaHealthCheck`` and ``ThreadedFinalize``, which Megatron-LM's in-process
    restart always uses, name their device ``torch.device(int(LOCAL_RANK))``."""
    import torch

    module.torch = _TorchNamingTheCpu(torch)


def _install() -> None:
    _record_signal_handlers()
    _hide_packages()
    sys.meta_path.insert(0, _AfterImport("megatron.training.training", _step_hooks))
    sys.meta_path.insert(0, _AfterImport("nemo.lens.providers", _signal_in_the_span_closer))
    for name in ("health_check", "finalize"):
        module = f"nvidia_resiliency_ext.inprocess.{name}"
        sys.meta_path.insert(0, _AfterImport(module, _nvrx_devices_on_cpu))
    _backport_override()
    _answer_cuda_on_cpu()
    with contextlib.suppress(ImportError):  # no OpenTelemetry SDK: nothing to capture
        _spans_to_file()


if os.environ.get("MEGATRON_LM_CPU_SHIMS") == "1":
    _install()
