"""The models of seven upstream PyTorch examples (pytorch/examples: vae, word_language_model,
time_sequence_prediction, super_resolution, dcgan, fast_neural_style, gcn), each written twice
with the same structure and names: in PyTorch and in EveryO (NHWC images, EveryO's layers).

Each :class:`Example` row builds both models, makes one input batch in both layouts and runs
both; tests/layers/test_convert_state_dict.py loads the PyTorch model's state dict into the
EveryO model with one ``eo.convert_state_dict`` call and compares the outputs. A row whose
EveryO layers do not exist yet names them in ``needs`` and is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

import everyo as eo


@dataclass
class Example:
    name: str
    torch_model: Callable  # (torch) -> torch.nn.Module
    everyo_model: Callable  # () -> eo.Module
    inputs: Callable  # (rng) -> tuple of NumPy arrays in PyTorch's layout
    run_torch: Callable  # (torch, model, inputs) -> list of arrays
    run_everyo: Callable  # (model, inputs) -> list of arrays
    needs: tuple = ()  # EveryO names the row needs
    example_input: Callable | None = None  # (inputs) -> convert_state_dict's example_input


def nhwc(images: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(images.transpose(0, 2, 3, 1))


def nchw(images: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2))


def _torch(torch, inputs):
    return [torch.tensor(a) for a in inputs]


# -- VAE ------------------------------------------------------------------------------------------
def vae_torch(torch):
    nn, F = torch.nn, torch.nn.functional

    class VAE(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc21, self.fc22 = nn.Linear(784, 400), nn.Linear(400, 20), \
                nn.Linear(400, 20)
            self.fc3, self.fc4 = nn.Linear(20, 400), nn.Linear(400, 784)

        def forward(self, x):
            h1 = F.relu(self.fc1(x.view(-1, 784)))
            mu, logvar = self.fc21(h1), self.fc22(h1)
            return torch.sigmoid(self.fc4(F.relu(self.fc3(mu)))), mu, logvar
    return VAE()


class VAE(eo.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc21, self.fc22 = eo.Linear(784, 400), eo.Linear(400, 20), \
            eo.Linear(400, 20)
        self.fc3, self.fc4 = eo.Linear(20, 400), eo.Linear(400, 784)

    def forward(self, x):
        h1 = eo.relu(self.fc1(x.reshape(-1, 784)))
        mu, logvar = self.fc21(h1), self.fc22(h1)
        return eo.sigmoid(self.fc4(eo.relu(self.fc3(mu)))), mu, logvar


VAE_ROW = Example(
    "vae", vae_torch, VAE, lambda rng: (rng.random((4, 1, 28, 28)),),
    lambda torch, m, x: [t.detach().numpy() for t in m(*_torch(torch, x))],
    lambda m, x: [t.data for t in m(nhwc(x[0]))],
    example_input=lambda x: nhwc(x[0]))


# -- word language model (LSTM, tied weights) ---------------------------------------------------
NTOKEN, NINP, NLAYERS = 50, 16, 2


def word_lm_torch(torch):
    nn, F = torch.nn, torch.nn.functional

    class RNNModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.5)
            self.encoder = nn.Embedding(NTOKEN, NINP)
            self.rnn = nn.LSTM(NINP, NINP, NLAYERS, dropout=0.5)
            self.decoder = nn.Linear(NINP, NTOKEN)
            self.decoder.weight = self.encoder.weight

        def forward(self, tokens):
            output, (h, c) = self.rnn(self.drop(self.encoder(tokens)))
            decoded = self.decoder(self.drop(output)).view(-1, NTOKEN)
            return F.log_softmax(decoded, dim=1), h, c
    return RNNModel()


class RNNModel(eo.Module):
    def __init__(self):
        super().__init__()
        self.drop = eo.Dropout(0.5)
        self.encoder = eo.Embedding(NTOKEN, NINP)
        self.rnn = eo.LSTM(NINP, NINP, NLAYERS, dropout=0.5, batch_first=False,
                           return_state=True)
        self.decoder = eo.Linear(NINP, NTOKEN)
        self.decoder.tie_weight(self.encoder.weight)

    def forward(self, tokens):
        output, (h, c) = self.rnn(self.drop(self.encoder(tokens)))
        decoded = self.decoder(self.drop(output)).reshape(-1, NTOKEN)
        return eo.log_softmax(decoded, axis=1), h, c


WORD_LM_ROW = Example(
    "word_language_model", word_lm_torch, RNNModel,
    lambda rng: (rng.integers(0, NTOKEN, (7, 3)),),
    lambda torch, m, x: [t.detach().numpy() for t in m(*_torch(torch, x))],
    lambda m, x: [t.data for t in m(x[0])])


# -- time-sequence prediction (LSTMCell) ----------------------------------------------------------
def sequence_torch(torch):
    nn = torch.nn

    class Sequence(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm1, self.lstm2 = nn.LSTMCell(1, 51), nn.LSTMCell(51, 51)
            self.linear = nn.Linear(51, 1)

        def forward(self, x, future=2):
            zeros = torch.zeros(x.size(0), 51, dtype=x.dtype)
            h, c, h2, c2 = zeros, zeros, zeros, zeros
            outputs = []
            for step in x.split(1, dim=1):
                h, c = self.lstm1(step, (h, c))
                h2, c2 = self.lstm2(h, (h2, c2))
                outputs.append(self.linear(h2))
            for _ in range(future):
                h, c = self.lstm1(outputs[-1], (h, c))
                h2, c2 = self.lstm2(h, (h2, c2))
                outputs.append(self.linear(h2))
            return torch.cat(outputs, dim=1)
    return Sequence()


class Sequence(eo.Module):
    def __init__(self):
        super().__init__()
        self.lstm1, self.lstm2 = eo.LSTMCell(1, 51), eo.LSTMCell(51, 51)
        self.linear = eo.Linear(51, 1)

    def forward(self, x, future=2):
        zeros = eo.zeros(x.shape[0], 51, dtype=x.dtype)
        h, c, h2, c2 = zeros, zeros, zeros, zeros
        outputs = []
        for t in range(x.shape[1]):
            h, c = self.lstm1(x[:, t:t + 1], (h, c))
            h2, c2 = self.lstm2(h, (h2, c2))
            outputs.append(self.linear(h2))
        for _ in range(future):
            h, c = self.lstm1(outputs[-1], (h, c))
            h2, c2 = self.lstm2(h, (h2, c2))
            outputs.append(self.linear(h2))
        return eo.concatenate(outputs, axis=1)


SEQUENCE_ROW = Example(
    "time_sequence_prediction", sequence_torch, Sequence,
    lambda rng: (np.sin(rng.random((3, 1)) + np.arange(10) / 5.0),),
    lambda torch, m, x: [m(*_torch(torch, x)).detach().numpy()],
    lambda m, x: [m(eo.tensor(x[0])).data], needs=("LSTMCell",))


# -- super-resolution (PixelShuffle) ---------------------------------------------------------------
def _super_resolution_net(base, conv, relu, pixel_shuffle, upscale_factor=3):
    """super_resolution's Net, for either framework's pieces."""

    class Net(base):
        def __init__(self):
            super().__init__()
            self.relu = relu()
            self.conv1 = conv(1, 64, (5, 5), (1, 1), (2, 2))
            self.conv2 = conv(64, 64, (3, 3), (1, 1), (1, 1))
            self.conv3 = conv(64, 32, (3, 3), (1, 1), (1, 1))
            self.conv4 = conv(32, upscale_factor ** 2, (3, 3), (1, 1), (1, 1))
            self.pixel_shuffle = pixel_shuffle(upscale_factor)

        def forward(self, x):
            x = self.relu(self.conv2(self.relu(self.conv1(x))))
            return self.pixel_shuffle(self.conv4(self.relu(self.conv3(x))))
    return Net()


def super_resolution_torch(torch):
    nn = torch.nn
    return _super_resolution_net(nn.Module, nn.Conv2d, nn.ReLU, nn.PixelShuffle)


def super_resolution_everyo():
    return _super_resolution_net(eo.Module, eo.Conv2D, eo.ReLU, eo.PixelShuffle)


SUPER_RESOLUTION_ROW = Example(
    "super_resolution", super_resolution_torch, super_resolution_everyo,
    lambda rng: (rng.random((2, 1, 8, 8)),),
    lambda torch, m, x: [m(*_torch(torch, x)).detach().numpy()],
    lambda m, x: [nchw(m(nhwc(x[0])).data)], needs=("PixelShuffle",))


# -- DCGAN (ConvTranspose2d, BatchNorm2d with running statistics) --------------------------------
NZ, NGF, NDF, NC = 8, 4, 4, 3


def _gan(base, sequential, up, down, batch_norm, relu, leaky_relu, tanh, sigmoid):
    """dcgan's Generator and Discriminator (both in one model: ``netG.*``, ``netD.*``), for
    either framework's pieces; ``up(cin, cout, first)`` is the transposed convolution (kernel
    4, stride 1 and padding 0 for the first, else stride 2 and padding 1)."""
    generator = [up(NZ, NGF * 8, True)]
    for k in (8, 4, 2):
        generator += [batch_norm(NGF * k), relu(), up(NGF * k, NGF * k // 2, False)]
    generator += [batch_norm(NGF), relu(), up(NGF, NC, False), tanh()]
    discriminator = [down(NC, NDF, 4, 2, 1, bias=False), leaky_relu()]
    for k in (1, 2, 4):
        discriminator += [down(NDF * k, NDF * k * 2, 4, 2, 1, bias=False),
                          batch_norm(NDF * k * 2), leaky_relu()]
    discriminator += [down(NDF * 8, 1, 4, 1, 0, bias=False), sigmoid()]

    class Network(base):
        def __init__(self, layers):
            super().__init__()
            self.main = sequential(*layers)

    class GAN(base):
        def __init__(self):
            super().__init__()
            self.netG, self.netD = Network(generator), Network(discriminator)

        def forward(self, z):
            fake = self.netG.main(z)
            return fake, self.netD.main(fake).reshape(-1)
    return GAN()


def dcgan_torch(torch):
    nn = torch.nn
    model = _gan(nn.Module, nn.Sequential,
                 lambda cin, cout, first: nn.ConvTranspose2d(cin, cout, 4, 1 if first else 2,
                                                             0 if first else 1, bias=False),
                 nn.Conv2d, nn.BatchNorm2d, lambda: nn.ReLU(True),
                 lambda: nn.LeakyReLU(0.2, inplace=True), nn.Tanh, nn.Sigmoid)
    for module in model.modules():  # running statistics that are not the defaults
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
            module.num_batches_tracked.fill_(7)
    return model


def dcgan_everyo():
    # PyTorch's padding=1 with kernel 4, stride 2 is "same"; padding=0 is "valid"
    return _gan(eo.Module, eo.Sequential,
                lambda cin, cout, first: eo.Conv2DTranspose(
                    cin, cout, 4, 1 if first else 2, padding="valid" if first else "same",
                    bias=False),
                eo.Conv2D, eo.BatchNorm2D, eo.ReLU, lambda: eo.LeakyReLU(0.2), eo.Tanh,
                eo.Sigmoid)


DCGAN_ROW = Example(
    "dcgan", dcgan_torch, dcgan_everyo, lambda rng: (rng.standard_normal((2, NZ, 1, 1)),),
    lambda torch, m, x: [t.detach().numpy() for t in m(*_torch(torch, x))],
    lambda m, x: [nchw(out) if out.ndim == 4 else out
                  for out in (t.data for t in m(nhwc(x[0])))])


# -- fast neural style (InstanceNorm2d, ReflectionPad2d, interpolate) ----------------------------
def _style_blocks(base, pad, conv, norm, relu, upsample):
    """fast_neural_style's ConvLayer and ResidualBlock, for either framework's pieces."""

    class ConvLayer(base):
        def __init__(self, cin, cout, kernel_size, stride, upsample=None):
            super().__init__()
            self.upsample = upsample
            self.reflection_pad = pad(kernel_size // 2)
            self.conv2d = conv(cin, cout, kernel_size, stride)

        def forward(self, x):
            if self.upsample:
                x = upsample(x, self.upsample)
            return self.conv2d(self.reflection_pad(x))

    class ResidualBlock(base):
        def __init__(self, channels):
            super().__init__()
            self.conv1, self.in1 = ConvLayer(channels, channels, 3, 1), norm(channels,
                                                                              affine=True)
            self.conv2, self.in2 = ConvLayer(channels, channels, 3, 1), norm(channels,
                                                                              affine=True)
            self.relu = relu()

        def forward(self, x):
            return self.in2(self.conv2(self.relu(self.in1(self.conv1(x))))) + x

    return ConvLayer, ResidualBlock


def style_torch(torch):
    nn, F = torch.nn, torch.nn.functional
    blocks = _style_blocks(nn.Module, nn.ReflectionPad2d, nn.Conv2d, nn.InstanceNorm2d,
                           nn.ReLU, lambda x, s: F.interpolate(x, mode="nearest",
                                                               scale_factor=s))
    return _transformer_net(nn.Module, *blocks, nn.InstanceNorm2d, nn.ReLU)


def _transformer_net(base, conv_layer, residual_block, instance_norm, relu):
    """fast_neural_style's TransformerNet, for either framework's building blocks."""

    class TransformerNet(base):
        def __init__(self):
            super().__init__()
            self.conv1, self.in1 = conv_layer(3, 32, 9, 1), instance_norm(32, affine=True)
            self.conv2, self.in2 = conv_layer(32, 64, 3, 2), instance_norm(64, affine=True)
            self.conv3, self.in3 = conv_layer(64, 128, 3, 2), instance_norm(128, affine=True)
            self.res1, self.res2, self.res3, self.res4, self.res5 = (
                residual_block(128) for _ in range(5))
            self.deconv1 = conv_layer(128, 64, 3, 1, upsample=2)
            self.in4 = instance_norm(64, affine=True)
            self.deconv2 = conv_layer(64, 32, 3, 1, upsample=2)
            self.in5 = instance_norm(32, affine=True)
            self.deconv3 = conv_layer(32, 3, 9, 1)
            self.relu = relu()

        def forward(self, x):
            y = self.relu(self.in1(self.conv1(x)))
            y = self.relu(self.in3(self.conv3(self.relu(self.in2(self.conv2(y))))))
            y = self.res5(self.res4(self.res3(self.res2(self.res1(y)))))
            y = self.relu(self.in5(self.deconv2(self.relu(self.in4(self.deconv1(y))))))
            return self.deconv3(y)
    return TransformerNet()


def style_everyo():
    blocks = _style_blocks(eo.Module, eo.ReflectionPad2D, eo.Conv2D, eo.InstanceNorm2D, eo.ReLU,
                           lambda x, s: eo.interpolate(x, mode="nearest", scale_factor=s))
    return _transformer_net(eo.Module, *blocks, eo.InstanceNorm2D, eo.ReLU)


STYLE_ROW = Example(
    "fast_neural_style", style_torch, style_everyo, lambda rng: (rng.random((1, 3, 16, 16)),),
    lambda torch, m, x: [m(*_torch(torch, x)).detach().numpy()],
    lambda m, x: [nchw(m(nhwc(x[0])).data)],
    needs=("InstanceNorm2D", "ReflectionPad2D", "interpolate"))


# -- GCN (a user's layer with plain parameters: no converter, kept as it is) ---------------------
def _gcn(base, graph_conv, dropout, relu, log_softmax):
    """gcn's GCN, for either framework's pieces."""

    class GCN(base):
        def __init__(self):
            super().__init__()
            self.gc1, self.gc2 = graph_conv(12, 16), graph_conv(16, 4)
            self.dropout = dropout(0.5)

        def forward(self, x, adj):
            x = self.dropout(relu(self.gc1(x, adj)))
            return log_softmax(self.gc2(x, adj))
    return GCN()


def gcn_torch(torch):
    nn, F = torch.nn, torch.nn.functional

    class GraphConv(nn.Module):
        def __init__(self, input_dim, output_dim):
            super().__init__()
            self.kernel = nn.Parameter(torch.empty(input_dim, output_dim))
            nn.init.xavier_normal_(self.kernel)
            self.bias = nn.Parameter(torch.rand(output_dim))

        def forward(self, x, adj):
            return torch.spmm(adj, torch.mm(x, self.kernel)) + self.bias
    return _gcn(nn.Module, GraphConv, nn.Dropout, F.relu, lambda x: F.log_softmax(x, dim=1))


class GraphConv(eo.Module):
    def __init__(self, input_dim, output_dim):
        super().__init__()
        self.kernel = eo.Parameter(np.zeros((input_dim, output_dim), np.float32))
        self.bias = eo.Parameter(np.zeros(output_dim, np.float32))

    def forward(self, x, adj):
        return adj @ (x @ self.kernel) + self.bias


def gcn_everyo():
    return _gcn(eo.Module, GraphConv, eo.Dropout, eo.relu, lambda x: eo.log_softmax(x, axis=1))


def _graph(rng):
    adjacency = (rng.random((9, 9)) < 0.3).astype(np.float64) + np.eye(9)
    adjacency = np.maximum(adjacency, adjacency.T)
    return rng.standard_normal((9, 12)), adjacency / adjacency.sum(axis=1, keepdims=True)


GCN_ROW = Example(
    "gcn", gcn_torch, gcn_everyo, _graph,
    lambda torch, m, x: [m(torch.tensor(x[0]), torch.tensor(x[1]).to_sparse()).detach().numpy()],
    lambda m, x: [m(eo.tensor(x[0]), eo.tensor(x[1])).data])

EXAMPLES = (VAE_ROW, WORD_LM_ROW, SEQUENCE_ROW, SUPER_RESOLUTION_ROW, DCGAN_ROW, STYLE_ROW,
            GCN_ROW)
