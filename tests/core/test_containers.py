"""ModuleList / ModuleDict, the guards on Module attributes, and layer paths in errors."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

import everyo as eo


class Affine(eo.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = eo.Parameter(np.ones(n))

    def forward(self, x):
        if x.shape[-1] != self.weight.shape[0]:
            raise eo.EveryOError(f"expected {self.weight.shape[0]} features, got {x.shape}")
        return x * self.weight


def test_module_list_registers_parameters_and_behaves_like_a_list():
    blocks = eo.ModuleList([Affine(2), Affine(2)])
    blocks.append(Affine(3))
    blocks.insert(0, Affine(4))
    assert [b.weight.shape[0] for b in blocks] == [4, 2, 2, 3]
    assert list(blocks.state_dict()) == ["0.weight", "1.weight", "2.weight", "3.weight"]
    del blocks[1]
    assert len(blocks) == 3 and [b.weight.shape[0] for b in blocks] == [4, 2, 3]
    assert blocks[-1].weight.shape == (3,) and len(blocks[1:]) == 2
    blocks[0] = Affine(5)
    assert blocks.state_dict()["0.weight"].shape == (5,)
    with pytest.raises(eo.EveryOError, match="takes Modules"):
        blocks.append(np.zeros(2))


def test_module_dict_registers_parameters_and_behaves_like_a_dict():
    heads = eo.ModuleDict({"a": Affine(2)})
    heads["b"] = Affine(3)
    heads.update([("c", Affine(1))])
    assert list(heads) == ["a", "b", "c"] and "b" in heads and len(heads) == 3
    assert [k for k, _ in heads.named_parameters()] == ["a.weight", "b.weight", "c.weight"]
    assert heads.pop("a").weight.shape == (2,) and list(heads.keys()) == ["b", "c"]
    with pytest.raises(eo.EveryOError, match="without '.'"):
        heads["x.y"] = Affine(1)
    with pytest.raises(KeyError):
        heads["missing"]


def test_model_with_containers_trains_and_round_trips():
    class Model(eo.Module):
        def __init__(self):
            super().__init__()
            self.blocks = eo.ModuleList([Affine(3) for _ in range(2)])
            self.heads = eo.ModuleDict({"out": Affine(3)})

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.heads["out"](x)

    model = Model()
    opt = eo.SGD(model.parameters(), lr=0.1)
    model(eo.ones(2, 3)).sum().backward()
    opt.step()
    assert not np.allclose(model.blocks[0].weight.data, 1.0)
    copy = Model()
    copy.load_state_dict(model.state_dict())
    np.testing.assert_array_equal(copy.heads["out"].weight.data, model.heads["out"].weight.data)


def test_plain_list_of_modules_warns_once_naming_the_fix():
    class Hidden(eo.Module):
        def __init__(self):
            super().__init__()
            self.layers = [Affine(2)]
            self.table = {"x": Affine(2)}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = Hidden()
        assert list(model.parameters()) == []
        list(model.parameters())
        Hidden().state_dict()
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2, messages
    assert "Hidden.layers is a plain list" in messages[0] and "eo.ModuleList" in messages[0]
    assert "Hidden.table is a plain dict" in messages[1] and "eo.ModuleDict" in messages[1]


def test_assigning_an_array_over_a_parameter_is_refused():
    layer = Affine(2)
    with pytest.raises(TypeError, match=r"Affine.weight.*Parameter.*load_state_dict"):
        layer.weight = np.zeros(2)
    with pytest.raises(TypeError, match="weight.data"):
        layer.weight = eo.tensor([0.0, 0.0])
    assert isinstance(layer.weight, eo.Parameter)
    layer.weight = eo.Parameter(np.zeros(2))  # replacing by a Parameter is fine
    assert [name for name, _ in layer.named_parameters()] == ["weight"]
    layer.weight.data[...] = 3.0
    assert layer.state_dict()["weight"].tolist() == [3.0, 3.0]


def test_layer_errors_name_the_layers_path():
    class Net(eo.Module):
        def __init__(self):
            super().__init__()
            self.features = eo.Sequential(Affine(2), Affine(2), eo.Sequential(Affine(3)))

        def forward(self, x):
            return self.features(x)

    with pytest.raises(eo.EveryOError, match=r"^features\.2\.0 \(Affine\): expected 3 features"):
        Net()(eo.ones(1, 2))
    with pytest.raises(eo.EveryOError, match=r"^Affine: expected 3"):
        Affine(3)(eo.ones(2))


def test_pooling_error_names_the_layer():
    model = eo.Sequential(eo.Conv2D(2, 3, 3, seed=0), eo.ReLU(), eo.MaxPool2D(4))
    with pytest.raises(eo.EveryOError, match=r"^2 \(MaxPool2D\): pooling: a 4x4 window") as info:
        model(eo.ones(1, 3, 3, 2))
    # the error still crosses process boundaries (pickle), message included
    assert str(pickle.loads(pickle.dumps(info.value))) == str(info.value)


def test_conv2d_takes_a_positional_none_bias():
    x, w = eo.randn(1, 5, 5, 2, seed=0), eo.randn(3, 3, 2, 4, seed=1)
    np.testing.assert_array_equal(eo.conv2d(x, w, None, padding="same").data,
                                  eo.conv2d(x, w, bias=None, padding="same").data)
