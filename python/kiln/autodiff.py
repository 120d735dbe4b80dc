"""MegEngine's megengine.autodiff: GradManager, which writes the gradients of a loss into the
.grad of the tensors attached to it (kiln.grad / value_and_grad are the functional API)."""
from . import _C
from .autograd import enable_grad, grad_nesting


class GradManager:
    """gm = GradManager().attach(params, callbacks=None); then, per step,

        with gm:                    # or gm.record() ... gm.backward(loss)
            loss = ...
            gm.backward(loss)       # param.grad += d loss / d param, for every attached param

    backward(y, dy=None): y a tensor or a list of tensors, dy their output gradients (default
    ones); the gradients are accumulated into .grad (set when it is None), after each callback
    (callback(param, grad) -> grad, in the order given) of the param's attach, and the recording
    ends. Works eagerly and inside kiln.trace / kiln.jit functions (the gradients are then
    computed in the graph)."""

    def __init__(self):
        self._params = []      # attached tensors, in attach order
        self._callbacks = {}   # id(param) -> [callback]
        self._recording = False

    def attach(self, params, callbacks=None):
        """Attaches a tensor or an iterable of tensors (a Cell's parameters); callbacks: a callable
        or a list of callables run on each gradient of these tensors. Returns self."""
        if isinstance(params, _C.TensorBase):
            params = [params]
        elif hasattr(params, "trainable_params"):
            params = params.trainable_params()
        params = list(params)
        if callbacks is None:
            callbacks = []
        elif callable(callbacks):
            callbacks = [callbacks]
        else:
            callbacks = list(callbacks)
        for cb in callbacks:
            if not callable(cb):
                raise TypeError(f"GradManager.attach: callbacks must be callables, got {type(cb).__name__}")
        for k, p in enumerate(params):
            if not isinstance(p, _C.TensorBase):
                raise TypeError(f"GradManager.attach: item {k} is a {type(p).__name__}, not a Tensor")
            if not p.dtype.is_floating_point:
                raise TypeError(f"GradManager.attach: item {k} has dtype {p.dtype}; only float tensors have gradients")
            if id(p) not in self._callbacks:
                self._params.append(p)
                self._callbacks[id(p)] = []
                if not p.requires_grad:
                    p.requires_grad = True
            self._callbacks[id(p)].extend(callbacks)
        return self

    def attached_tensors(self):
        return list(self._params)

    def detach(self, params):
        """Stops computing gradients for these tensors (a tensor or an iterable of them)."""
        for p in [params] if isinstance(params, _C.TensorBase) else list(params):
            if id(p) in self._callbacks:
                del self._callbacks[id(p)]
                self._params = [q for q in self._params if q is not p]

    def record(self):
        if self._recording:
            raise RuntimeError("GradManager: already recording")
        self._recording = True
        self._grad_mode = enable_grad()
        self._grad_mode.__enter__()
        # what runs now will be differentiated: a jitted function called here keeps its results'
        # autograd history (bytecode capture compiles its pieces with their backward)
        grad_nesting.depth = getattr(grad_nesting, "depth", 0) + 1

    def release(self):
        if self._recording:
            self._recording = False
            grad_nesting.depth -= 1
            self._grad_mode.__exit__(None, None, None)

    def __enter__(self):
        self.record()
        return self

    def __exit__(self, *exc):
        self.release()
        return False

    def backward(self, y=None, dy=None):
        if not self._recording:
            raise RuntimeError("GradManager.backward: no recording in progress; call record() or use `with gm:` "
                               "around the computation of the loss")
        try:
            if y is None:
                raise TypeError("GradManager.backward: give the loss (a tensor or a list of tensors)")
            ys = [y] if isinstance(y, _C.TensorBase) else list(y)
            if dy is None:
                dys = None
            else:
                dys = [dy] if isinstance(dy, _C.TensorBase) else list(dy)
                if len(dys) != len(ys):
                    raise ValueError(f"GradManager.backward: {len(dys)} dy for {len(ys)} y")
            for k, t in enumerate(ys):
                if not isinstance(t, _C.TensorBase):
                    raise TypeError(f"GradManager.backward: y {k} is a {type(t).__name__}, not a Tensor")
            keep = [k for k, t in enumerate(ys) if t.requires_grad]
            params = [p for p in self._params]
            if not keep or not params:
                return
            if _C.is_tracing():
                from .jit.replay import grad_writes_replayed, mark_not_replayable

                # .grad is Python state a compiled graph cannot set unless the recording replays
                # the assignments (kiln.trace): otherwise the traced function runs eagerly, and
                # bytecode capture stops here, before the callbacks (collectives) run
                if not grad_writes_replayed():
                    mark_not_replayable("GradManager.backward assigns the .grad of its tensors")
            grads = _C.grad([ys[k] for k in keep], params, None if dys is None else [dys[k] for k in keep], False)
            for p, g in zip(params, grads):
                if g is None:
                    continue
                for cb in self._callbacks.get(id(p), ()):
                    g = cb(p, g)
                p.grad = g if p.grad is None else p.grad + g
        finally:
            self.release()
