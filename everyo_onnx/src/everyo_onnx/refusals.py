"""Which modules the exporter refuses by design, and how a refusal reads.

Recurrent layers, embeddings, attention and the transformer layers are refused even though
their forward passes dispatch ordinary ops: exporting them faithfully needs integer lookups,
time-step loops and masks the tracer would reproduce only for the traced shapes. A model that
needs them exported writes its attention from core ops (see docs/onnx.md).

Nobody lists them here: each such layer class declares ``onnx_export = "refused"`` where it is
defined (see ``everyo.hookspecs.DECLARATIONS``), and the exporter reads that declaration.
"""

from __future__ import annotations

import numpy as np

from everyo import Tensor, registry


def refused_by_design() -> list[str]:
    """Names of the registered layers that declare ``onnx_export = "refused"``.

    Example:
        >>> "LSTM" in refused_by_design(), "Linear" in refused_by_design()
        (True, False)
    """
    layers = registry("layers")
    return [name for name, status in layers.declared("onnx_export").items()
            if status == "refused" and vars(layers[name]).get("onnx_export") == "refused"]


def refusal_reason(module) -> str | None:
    """Why ``module`` is refused by design, or None when it may be exported.

    Example:
        >>> import everyo as eo
        >>> refusal_reason(eo.LSTM(2, 2)), refusal_reason(eo.ReLU())
        ('refused by design', None)
    """
    # NOTE: the exact class's own declaration, as converters are looked up by exact class: a
    # subclass may compute something else, so it is traced (and refused op by op if need be).
    if vars(type(module)).get("onnx_export") == "refused":
        return "refused by design"
    return None


def refused_modules(model, layer_converters: dict) -> list[str]:
    """``path (Class)`` of every module refused by name, outermost only: the inside of a
    refused module or of one emitted whole by a layer converter is not looked at."""
    found, skipped = [], []
    for path, module in model.named_modules():
        if any(path == s or path.startswith(s + ".") for s in skipped):
            continue
        if refusal_reason(module) is not None:
            found.append(module_label(path, module))
            skipped.append(path)
        elif type(module) in layer_converters and path:
            skipped.append(path)
    return found


def module_label(path: str, module) -> str:
    """How a module is named in messages: ``blocks.1.attn (MultiHeadAttention)``."""
    return f"{path or 'the model'} ({type(module).__name__})"


def refusal_message(problems: list[str]) -> str:
    noun = "refusal" if len(problems) == 1 else f"{len(problems)} refusals"
    return (f"cannot export to ONNX ({noun}): " + "; ".join(problems)
            + f". Refused by design: {', '.join(refused_by_design())}; any other module is traced "
            f"and needs an ONNX converter for every op its forward reaches (a plugin adds one "
            f"through the everyo_register_onnx_converters hook). Nothing was written.")


def untraced_output(position: int, output, parameter_names: dict) -> str:
    """Why output ``position`` of a traced forward, which no traced op computed, cannot be
    exported; ``parameter_names`` maps ``id(parameter)`` to its name."""
    start = f"export_onnx: output {position} of the model is "
    if not isinstance(output, Tensor):
        return (start + f"a {type(output).__name__}, not a Tensor; the forward must return "
                f"tensors computed from its inputs (one, or a tuple/list of them)")
    dtype = np.dtype(output.dtype).name
    kind = f"{'an' if dtype[0] in 'aeiou' else 'a'} {dtype} Tensor"
    if np.dtype(output.dtype).kind in "biu":
        return (start + f"{kind} computed outside the ops the tracer sees: integer results "
                f"such as Tensor.argmax/argmin do not go through EveryO's dispatch, so no "
                f"graph can compute them. Export the scores instead and take the argmax of "
                f"the exported model's output")
    if id(output) in parameter_names:
        what = f"the parameter {parameter_names[id(output)]!r}"
    else:
        what = "a constant, or a value computed outside EveryO's ops (in NumPy, via .data)"
    return (start + f"{kind} that no op computed from the inputs ({what}); the forward must "
            f"return tensors computed from its inputs by EveryO ops")
