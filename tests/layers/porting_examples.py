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
def super_resolution_torch(torch):
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self, upscale_factor=3):
            super().__init__()
            self.relu = nn.ReLU()
            self.conv1 = nn.Conv2d(1, 64, (5, 5), (1, 1), (2, 2))
            self.conv2 = nn.Conv2d(64, 64, (3, 3), (1, 1), (1, 1))
            self.conv3 = nn.Conv2d(64, 32, (3, 3), (1, 1), (1, 1))
            self.conv4 = nn.Conv2d(32, upscale_factor ** 2, (3, 3), (1, 1), (1, 1))
            self.pixel_shuffle = nn.PixelShuffle(upscale_factor)

        def forward(self, x):
            x = self.relu(self.conv2(self.relu(self.conv1(x))))
            return self.pixel_shuffle(self.conv4(self.relu(self.conv3(x))))
    return Net()


class SuperResolutionNet(eo.Module):
    def __init__(self, upscale_factor=3):
        super().__init__()
        self.relu = eo.ReLU()
        self.conv1 = eo.Conv2D(1, 64, (5, 5), (1, 1), (2, 2))
        self.conv2 = eo.Conv2D(64, 64, (3, 3), (1, 1), (1, 1))
        self.conv3 = eo.Conv2D(64, 32, (3, 3), (1, 1), (1, 1))
        self.conv4 = eo.Conv2D(32, upscale_factor ** 2, (3, 3), (1, 1), (1, 1))
        self.pixel_shuffle = eo.PixelShuffle(upscale_factor)

    def forward(self, x):
        x = self.relu(self.conv2(self.relu(self.conv1(x))))
        return self.pixel_shuffle(self.conv4(self.relu(self.conv3(x))))


SUPER_RESOLUTION_ROW = Example(
    "super_resolution", super_resolution_torch, SuperResolutionNet,
    lambda rng: (rng.random((2, 1, 8, 8)),),
    lambda torch, m, x: [m(*_torch(torch, x)).detach().numpy()],
    lambda m, x: [nchw(m(nhwc(x[0])).data)], needs=("PixelShuffle",))


# -- DCGAN (ConvTranspose2d, BatchNorm2d with running statistics) --------------------------------
NZ, NGF, NDF, NC = 8, 4, 4, 3


def dcgan_torch(torch):
    nn = torch.nn

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            layers = [nn.ConvTranspose2d(NZ, NGF * 8, 4, 1, 0, bias=False)]
            for k in (8, 4, 2):
                layers += [nn.BatchNorm2d(NGF * k), nn.ReLU(True),
                           nn.ConvTranspose2d(NGF * k, NGF * k // 2, 4, 2, 1, bias=False)]
            layers += [nn.BatchNorm2d(NGF), nn.ReLU(True),
                       nn.ConvTranspose2d(NGF, NC, 4, 2, 1, bias=False), nn.Tanh()]
            self.main = nn.Sequential(*layers)

        def forward(self, z):
            return self.main(z)

    class Discriminator(nn.Module):
        def __init__(self):
            super().__init__()
            layers = [nn.Conv2d(NC, NDF, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True)]
            for k in (1, 2, 4):
                layers += [nn.Conv2d(NDF * k, NDF * k * 2, 4, 2, 1, bias=False),
                           nn.BatchNorm2d(NDF * k * 2), nn.LeakyReLU(0.2, inplace=True)]
            layers += [nn.Conv2d(NDF * 8, 1, 4, 1, 0, bias=False), nn.Sigmoid()]
            self.main = nn.Sequential(*layers)

        def forward(self, x):
            return self.main(x).view(-1, 1).squeeze(1)

    class GAN(nn.Module):  # both networks in one state dict: netG.*, netD.*
        def __init__(self):
            super().__init__()
            self.netG, self.netD = Generator(), Discriminator()
            for module in self.modules():  # running statistics that are not the defaults
                if isinstance(module, nn.BatchNorm2d):
                    module.running_mean.uniform_(-0.5, 0.5)
                    module.running_var.uniform_(0.5, 2.0)
                    module.num_batches_tracked.fill_(7)

        def forward(self, z):
            fake = self.netG(z)
            return fake, self.netD(fake)
    return GAN()


class Generator(eo.Module):
    def __init__(self):
        super().__init__()
        layers = [eo.Conv2DTranspose(NZ, NGF * 8, 4, 1, padding="valid", bias=False)]
        for k in (8, 4, 2):  # PyTorch's padding=1 with kernel 4, stride 2 is "same"
            layers += [eo.BatchNorm2D(NGF * k), eo.ReLU(),
                       eo.Conv2DTranspose(NGF * k, NGF * k // 2, 4, 2, padding="same",
                                          bias=False)]
        layers += [eo.BatchNorm2D(NGF), eo.ReLU(),
                   eo.Conv2DTranspose(NGF, NC, 4, 2, padding="same", bias=False), eo.Tanh()]
        self.main = eo.Sequential(*layers)

    def forward(self, z):
        return self.main(z)


class Discriminator(eo.Module):
    def __init__(self):
        super().__init__()
        layers = [eo.Conv2D(NC, NDF, 4, 2, 1, bias=False), eo.LeakyReLU(0.2)]
        for k in (1, 2, 4):
            layers += [eo.Conv2D(NDF * k, NDF * k * 2, 4, 2, 1, bias=False),
                       eo.BatchNorm2D(NDF * k * 2), eo.LeakyReLU(0.2)]
        layers += [eo.Conv2D(NDF * 8, 1, 4, 1, 0, bias=False), eo.Sigmoid()]
        self.main = eo.Sequential(*layers)

    def forward(self, x):
        return self.main(x).reshape(-1)


class GAN(eo.Module):
    def __init__(self):
        super().__init__()
        self.netG, self.netD = Generator(), Discriminator()

    def forward(self, z):
        fake = self.netG(z)
        return fake, self.netD(fake)


DCGAN_ROW = Example(
    "dcgan", dcgan_torch, GAN, lambda rng: (rng.standard_normal((2, NZ, 1, 1)),),
    lambda torch, m, x: [t.detach().numpy() for t in m(*_torch(torch, x))],
    lambda m, x: [nchw(out) if out.ndim == 4 else out
                  for out in (t.data for t in m(nhwc(x[0])))])


# -- fast neural style (InstanceNorm2d, ReflectionPad2d, interpolate) ----------------------------
def style_torch(torch):
    nn, F = torch.nn, torch.nn.functional

    class ConvLayer(nn.Module):
        def __init__(self, cin, cout, kernel_size, stride, upsample=None):
            super().__init__()
            self.upsample = upsample
            self.reflection_pad = nn.ReflectionPad2d(kernel_size // 2)
            self.conv2d = nn.Conv2d(cin, cout, kernel_size, stride)

        def forward(self, x):
            if self.upsample:
                x = F.interpolate(x, mode="nearest", scale_factor=self.upsample)
            return self.conv2d(self.reflection_pad(x))

    class ResidualBlock(nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.conv1, self.in1 = ConvLayer(channels, channels, 3, 1), \
                nn.InstanceNorm2d(channels, affine=True)
            self.conv2, self.in2 = ConvLayer(channels, channels, 3, 1), \
                nn.InstanceNorm2d(channels, affine=True)
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.in2(self.conv2(self.relu(self.in1(self.conv1(x))))) + x

    return _transformer_net(nn, ConvLayer, ResidualBlock, nn.InstanceNorm2d, nn.ReLU)


def _transformer_net(nn, conv_layer, residual_block, instance_norm, relu):
    """fast_neural_style's TransformerNet, for either framework's building blocks."""
    base = nn.Module

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


class StyleConvLayer(eo.Module):
    def __init__(self, cin, cout, kernel_size, stride, upsample=None):
        super().__init__()
        self.upsample = upsample
        self.reflection_pad = eo.ReflectionPad2D(kernel_size // 2)
        self.conv2d = eo.Conv2D(cin, cout, kernel_size, stride)

    def forward(self, x):
        if self.upsample:
            x = eo.interpolate(x, mode="nearest", scale_factor=self.upsample)
        return self.conv2d(self.reflection_pad(x))


class StyleResidualBlock(eo.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1, self.in1 = StyleConvLayer(channels, channels, 3, 1), \
            eo.InstanceNorm2D(channels, affine=True)
        self.conv2, self.in2 = StyleConvLayer(channels, channels, 3, 1), \
            eo.InstanceNorm2D(channels, affine=True)
        self.relu = eo.ReLU()

    def forward(self, x):
        return self.in2(self.conv2(self.relu(self.in1(self.conv1(x))))) + x


class _EveryOModules:
    Module = eo.Module


def style_everyo():
    return _transformer_net(_EveryOModules, StyleConvLayer, StyleResidualBlock,
                            eo.InstanceNorm2D, eo.ReLU)


STYLE_ROW = Example(
    "fast_neural_style", style_torch, style_everyo, lambda rng: (rng.random((1, 3, 16, 16)),),
    lambda torch, m, x: [m(*_torch(torch, x)).detach().numpy()],
    lambda m, x: [nchw(m(nhwc(x[0])).data)],
    needs=("InstanceNorm2D", "ReflectionPad2D", "interpolate"))


# -- GCN (a user's layer with plain parameters: no converter, kept as it is) ---------------------
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

    class GCN(nn.Module):
        def __init__(self):
            super().__init__()
            self.gc1, self.gc2 = GraphConv(12, 16), GraphConv(16, 4)
            self.dropout = nn.Dropout(0.5)

        def forward(self, x, adj):
            x = self.dropout(F.relu(self.gc1(x, adj)))
            return F.log_softmax(self.gc2(x, adj), dim=1)
    return GCN()


class GraphConv(eo.Module):
    def __init__(self, input_dim, output_dim):
        super().__init__()
        self.kernel = eo.Parameter(np.zeros((input_dim, output_dim), np.float32))
        self.bias = eo.Parameter(np.zeros(output_dim, np.float32))

    def forward(self, x, adj):
        return adj @ (x @ self.kernel) + self.bias


class GCN(eo.Module):
    def __init__(self):
        super().__init__()
        self.gc1, self.gc2 = GraphConv(12, 16), GraphConv(16, 4)
        self.dropout = eo.Dropout(0.5)

    def forward(self, x, adj):
        x = self.dropout(eo.relu(self.gc1(x, adj)))
        return eo.log_softmax(self.gc2(x, adj), axis=1)


def _graph(rng):
    adjacency = (rng.random((9, 9)) < 0.3).astype(np.float64) + np.eye(9)
    adjacency = np.maximum(adjacency, adjacency.T)
    return rng.standard_normal((9, 12)), adjacency / adjacency.sum(axis=1, keepdims=True)


GCN_ROW = Example(
    "gcn", gcn_torch, GCN, _graph,
    lambda torch, m, x: [m(torch.tensor(x[0]), torch.tensor(x[1]).to_sparse()).detach().numpy()],
    lambda m, x: [m(eo.tensor(x[0]), eo.tensor(x[1])).data])

EXAMPLES = (VAE_ROW, WORD_LM_ROW, SEQUENCE_ROW, SUPER_RESOLUTION_ROW, DCGAN_ROW, STYLE_ROW,
            GCN_ROW)
