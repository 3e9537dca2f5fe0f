"""Python twins of models/resnet.cpp, models/unet.cpp and models/amoebanet.cpp, for the
torchgpipe side of the gpu_pipeline benchmark (PyTorch + torchgpipe 0.0.7).

Contract with the C++ models, so that both sides run the same network on the same weights:

* each function returns an nn.Sequential with the C++ model's top-level layers, same count,
  same order, same names (balance lists are per top-level layer and shared by both sides);
* its state_dict() keys and shapes are the C++ model's named_parameters() plus
  named_buffers(), so that load_state_dict(cpp_state, strict=True) takes the C++ weights;
* its forward is the C++ forward: skips are torchgpipe.skip stashes and pops isolated in the
  same namespaces, and AmoebaNet's layers pass tuples where the C++ passes lists (torchgpipe
  hands a partition's tuple output to the next layer as one argument);
* options and validation are the C++ ones (ValueError where the C++ throws c10::ValueError).
"""
from collections import OrderedDict
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor, nn
import torch.nn.functional as F

# torchgpipe 0.0.7 needs no patch on torch 2.11 (checked on the CPU); e.g. its wheel on PYTHONPATH.
from torchgpipe.skip import Namespace, pop, skippable, stash

__all__ = ['resnet', 'resnet101', 'unet', 'amoebanetd']


# ResNet (models/resnet.cpp) -----------------------------------------------------------------
#
# A bottleneck block is 11 layers: Identity (stashes its input), conv1x1, bn, relu, conv3x3 (the
# block's stride), bn, relu, conv1x1 (4x wider), bn, Residual (pops the input, downsamples it
# when the shape changes, adds), relu; the block's stash and pop share a namespace of their own.

def _resnet_conv(in_channels: int, out_channels: int, kernel: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=kernel // 2,
                     bias=False)


@skippable(stash=['identity'])
class Identity(nn.Module):
    """Stashes the block's input for its Residual."""

    def forward(self, input: Tensor):  # type: ignore
        yield stash('identity', input)
        return input


@skippable(pop=['identity'])
class _PopIdentity(nn.Module):
    """Pops the block's input and hands it on beside the main tensor."""

    def forward(self, input: Tensor):  # type: ignore
        identity = yield pop('identity')
        return input, identity


class Residual(_PopIdentity):
    """Adds the block's input, downsampled when the block changes its shape."""

    def __init__(self, downsample: Optional[nn.Sequential] = None) -> None:
        super().__init__()
        # The layer owns the downsample, not the module @skippable wraps (registered as
        # "module"), so that its names are "<layer>.downsample.*" as in the C++.
        self.downsample = downsample

    def forward(self, input: Tensor) -> Tensor:  # type: ignore
        input, identity = super().forward(input)
        if self.downsample is not None:
            identity = self.downsample(identity)
        return input + identity

    def __repr__(self) -> str:
        # Skippable's repr shows the wrapped module alone, which would hide the downsample.
        return nn.Module.__repr__(self)


def _add_bottleneck(layers: 'OrderedDict[str, nn.Module]', name: str, inplanes: int,
                    planes: int, stride: int) -> None:
    downsample = None
    if stride != 1 or inplanes != planes * 4:
        downsample = nn.Sequential(_resnet_conv(inplanes, planes * 4, 1, stride),
                                   nn.BatchNorm2d(planes * 4))
    ns = Namespace()
    layers[name + '_identity'] = Identity().isolate(ns)
    layers[name + '_conv1'] = _resnet_conv(inplanes, planes, 1)
    layers[name + '_bn1'] = nn.BatchNorm2d(planes)
    layers[name + '_relu1'] = nn.ReLU()
    layers[name + '_conv2'] = _resnet_conv(planes, planes, 3, stride)
    layers[name + '_bn2'] = nn.BatchNorm2d(planes)
    layers[name + '_relu2'] = nn.ReLU()
    layers[name + '_conv3'] = _resnet_conv(planes, planes * 4, 1)
    layers[name + '_bn3'] = nn.BatchNorm2d(planes * 4)
    layers[name + '_residual'] = Residual(downsample).isolate(ns)
    layers[name + '_relu3'] = nn.ReLU()


def resnet(layers: Sequence[int], num_classes: int = 1000, base_width: int = 64) -> nn.Sequential:
    """The bottleneck ResNet with `layers` blocks in its four stages; ResNet-101 is
    [3, 4, 23, 3]. Raises ValueError unless there are four positive stage sizes and positive
    widths."""
    layers = list(layers)
    if len(layers) != 4 or not all(n > 0 for n in layers):
        raise ValueError(f'ResNet needs four positive stage sizes, but got {layers}')
    if not (base_width > 0 and num_classes > 0):
        raise ValueError(f'ResNet widths must be positive (base_width {base_width}, '
                         f'num_classes {num_classes})')
    base = base_width
    model: 'OrderedDict[str, nn.Module]' = OrderedDict()
    model['conv1'] = nn.Conv2d(3, base, 7, stride=2, padding=3, bias=False)
    model['bn1'] = nn.BatchNorm2d(base)
    model['relu'] = nn.ReLU()
    model['maxpool'] = nn.MaxPool2d(3, stride=2, padding=1)
    inplanes = base
    for stage in range(4):
        planes = base << stage
        for block in range(layers[stage]):
            stride = 2 if stage > 0 and block == 0 else 1
            _add_bottleneck(model, f'layer{stage + 1}_{block}', inplanes, planes, stride)
            inplanes = planes * 4
    model['avgpool'] = nn.AdaptiveAvgPool2d((1, 1))
    model['flat'] = nn.Flatten()
    model['fc'] = nn.Linear(inplanes, num_classes)
    sequential = nn.Sequential(model)

    # torchvision's initialization, as the C++ does.
    for module in sequential.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode='fan_out', nonlinearity='relu')
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    return sequential


def resnet101(num_classes: int = 1000) -> nn.Sequential:
    """ResNet-101: resnet([3, 4, 23, 3])."""
    return resnet([3, 4, 23, 3], num_classes=num_classes)


# U-Net (models/unet.cpp) --------------------------------------------------------------------
#
# Each encoder level ends in a Stash of its output (isolated in the level's namespace) and a
# 2x2 max-pool; each decoder level starts with a 2x upsample and a PopCat that concatenates the
# stashed tensor along the channels. A cell is `num_convs` x (Conv3x3, Dropout2d, InstanceNorm,
# LeakyReLU), each a layer of its own, so the Sequential can be cut anywhere.

def _pad_cat(input: Tensor, skip: Tensor) -> Tensor:
    """Pads `input` at the end of each spatial dim to `skip`'s size, then concatenates the
    channels."""
    if input.shape[2:] != skip.shape[2:]:
        pad: List[int] = []
        for d in range(input.dim() - 1, 1, -1):
            pad += [0, skip.size(d) - input.size(d)]
        input = F.pad(input, pad)
    return torch.cat([input, skip], dim=1)


@skippable(stash=['skip'])
class Stash(nn.Module):
    """Stashes an encoder level's output for its decoder."""

    def forward(self, input: Tensor):  # type: ignore
        yield stash('skip', input)
        return input


@skippable(pop=['skip'])
class PopCat(nn.Module):
    """Concatenates the encoder level's output to the decoder's input."""

    def forward(self, input: Tensor):  # type: ignore
        skip = yield pop('skip')
        return _pad_cat(input, skip)


def unet(depth: int = 5, num_convs: int = 5, base_channels: int = 64, input_channels: int = 3,
         output_channels: int = 1, dropout: float = 0.1) -> nn.Sequential:
    """The U-Net, `depth` levels of `num_convs` convolutions per cell; level i has
    base_channels * 2^i channels, and the input's height and width must divide by 2^depth.
    Raises ValueError for a non-positive size."""
    if not (depth > 0 and num_convs > 0 and base_channels > 0 and input_channels > 0 and
            output_channels > 0):
        raise ValueError(f'U-Net sizes must be positive (depth {depth}, num_convs {num_convs}, '
                         f'base_channels {base_channels}, input_channels {input_channels}, '
                         f'output_channels {output_channels})')
    base = base_channels
    namespaces = [Namespace() for _ in range(depth)]
    model: 'OrderedDict[str, nn.Module]' = OrderedDict()

    def add(name: str, layer: nn.Module) -> None:
        # Names are numbered across the whole model, as in the C++.
        model[f'{name}_{len(model)}'] = layer

    def cell(name: str, in_channels: int, mid: int, out: int) -> None:
        for k in range(num_convs):
            from_ = in_channels if k == 0 else mid
            to = out if k == num_convs - 1 else mid
            add(name + '_conv', nn.Conv2d(from_, to, 3, padding=1, bias=False))
            add(name + '_dropout', nn.Dropout2d(dropout))
            add(name + '_norm', nn.InstanceNorm2d(to))
            add(name + '_relu', nn.LeakyReLU(negative_slope=1e-2))

    def channels(i: int) -> int:
        return base << i

    for i in range(depth):
        name = f'encoder{i}'
        cell(name, input_channels if i == 0 else channels(i - 1), channels(i), channels(i))
        add(name + '_skip', Stash().isolate(namespaces[i]))
        add(name + '_down', nn.MaxPool2d(2, stride=2))
    cell('bottleneck', channels(depth - 1), channels(depth), channels(depth - 1))
    for i in reversed(range(depth)):
        name = f'decoder{i}'
        add(name + '_up', nn.Upsample(scale_factor=(2.0, 2.0), mode='nearest'))
        add(name + '_skip', PopCat().isolate(namespaces[i]))
        # In: the upsampled deeper level and the skip, channels(i) each. Out: channels(i - 1),
        # and base / 2 for the last decoder.
        out = base // 2 if i == 0 else channels(i - 1)
        cell(name, channels(i) * 2, out, out)
    add('segment', nn.Conv2d(base // 2, output_channels, 1, bias=False))
    return nn.Sequential(model)


# AmoebaNet-D (models/amoebanet.cpp) ---------------------------------------------------------
#
#   stem1 (conv) - stem2, stem3 (reduction cells) - L/3 normal cells - reduction cell
#   - L/3 normal cells - reduction cell - L/3 normal cells - classify
#
# A cell reads the outputs of the two cells before it. The layers carry both as a tuple: every
# cell takes (previous, before previous) ((previous,) for the first cell, used as both) and
# returns (its output, previous). The stem returns a tuple of one tensor; classify takes the
# tuple and returns the logits. The C++ Blocks (Sequentials) are nn.Sequentials here, so that
# the names inside them ("0", "1", ...) are the same.

States = Union[Tuple[Tensor, ...], List[Tensor]]


def _amoeba_conv(in_channels: int, out_channels: int, kernel=1, stride=1,
                 padding=0) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, kernel, stride=stride, padding=padding,
                     bias=False)


def _relu_conv_bn(in_channels: int, out_channels: int, kernel=1, stride=1,
                  padding=0) -> nn.Sequential:
    return nn.Sequential(nn.ReLU(), _amoeba_conv(in_channels, out_channels, kernel, stride,
                                                 padding),
                         nn.BatchNorm2d(out_channels))


class FactorizedReduce(nn.Module):
    """Halves height and width with two 1x1 convolutions, the second shifted by one pixel, each
    giving half of the output channels."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = _amoeba_conv(in_channels, out_channels // 2, 1, 2)
        self.conv2 = _amoeba_conv(in_channels, out_channels // 2, 1, 2)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, input: Tensor) -> Tensor:  # type: ignore
        x = torch.relu(input)
        shifted = F.pad(x[:, :, 1:, 1:], (0, 1, 0, 1))
        return self.bn(torch.cat([self.conv1(x), self.conv2(shifted)], dim=1))


def _operation(op: str, c: int, stride: int) -> nn.Sequential:
    """A cell's operation: maps `c` channels to as many, with `stride`."""
    if op == 'none':
        return nn.Sequential(nn.Identity() if stride == 1 else FactorizedReduce(c, c))
    if op in ('avg_pool_3x3', 'max_pool_3x3'):
        # The reference's max_pool_3x3 is an average pool too; kept, as the C++ keeps it.
        return nn.Sequential(nn.AvgPool2d(3, stride=stride, padding=1, count_include_pad=False))
    if op == 'max_pool_2x2':
        return nn.Sequential(nn.MaxPool2d(2, stride=stride))
    if op == 'conv_1x7_7x1':
        return nn.Sequential(_relu_conv_bn(c, c // 4),
                             _relu_conv_bn(c // 4, c // 4, (1, 7), (1, stride), (0, 3)),
                             _relu_conv_bn(c // 4, c // 4, (7, 1), (stride, 1), (3, 0)),
                             _relu_conv_bn(c // 4, c))
    if op == 'conv_1x1':
        return _relu_conv_bn(c, c, 1, stride)
    if op == 'conv_3x3':
        return nn.Sequential(_relu_conv_bn(c, c // 4), _relu_conv_bn(c // 4, c // 4, 3, stride, 1),
                             _relu_conv_bn(c // 4, c))
    raise ValueError(f'unknown AmoebaNet operation {op!r}')


# AmoebaNet-D's genotype: pairs of (input state, operation); each pair's sum is a new state; the
# output concatenates the states in the concat list.
_NORMAL_OPERATIONS = [(1, 'conv_1x1'), (1, 'max_pool_3x3'), (1, 'none'), (0, 'conv_1x7_7x1'),
                      (0, 'conv_1x1'), (0, 'conv_1x7_7x1'), (2, 'max_pool_3x3'), (2, 'none'),
                      (1, 'avg_pool_3x3'), (5, 'conv_1x1')]
_NORMAL_CONCAT = [0, 3, 4, 6]
_REDUCTION_OPERATIONS = [(0, 'max_pool_2x2'), (0, 'max_pool_3x3'), (2, 'none'), (1, 'conv_3x3'),
                         (2, 'conv_1x7_7x1'), (2, 'max_pool_3x3'), (3, 'none'),
                         (1, 'max_pool_2x2'), (2, 'avg_pool_3x3'), (3, 'conv_1x1')]
_REDUCTION_CONCAT = [4, 5, 6]


class Stem(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = _amoeba_conv(3, channels, 3, 2, 1)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, input: Tensor) -> Tuple[Tensor]:  # type: ignore
        return (self.bn(self.conv(torch.relu(input))),)


class Cell(nn.Module):
    """Takes (s1, s2), the previous state and the one before ((s,) for both), returns
    (output, s1)."""

    def __init__(self, channels_prev_prev: int, channels_prev: int, channels: int,
                 reduction: bool, reduction_prev: bool) -> None:
        super().__init__()
        operations = _REDUCTION_OPERATIONS if reduction else _NORMAL_OPERATIONS
        self.concat = _REDUCTION_CONCAT if reduction else _NORMAL_CONCAT
        self.indices = [index for index, _ in operations]
        self.reduce1 = _relu_conv_bn(channels_prev, channels)
        if reduction_prev:
            self.reduce2 = nn.Sequential(FactorizedReduce(channels_prev_prev, channels))
        elif channels_prev_prev != channels:
            self.reduce2 = _relu_conv_bn(channels_prev_prev, channels)
        else:
            self.reduce2 = nn.Sequential(nn.Identity())
        for k, (index, op) in enumerate(operations):
            # A reduction cell halves the size where it reads the cell's inputs.
            stride = 2 if reduction and index < 2 else 1
            # "operations_k", not a ModuleList's "operations.k": the C++ names.
            self.add_module(f'operations_{k}', _operation(op, channels, stride))

    def forward(self, states: States) -> Tuple[Tensor, Tensor]:  # type: ignore
        if not isinstance(states, (tuple, list)) or len(states) not in (1, 2):
            got = len(states) if isinstance(states, (tuple, list)) else type(states).__name__
            raise ValueError(f'an AmoebaNet cell takes 1 or 2 tensors, but got {got}')
        hidden = [self.reduce1(states[0]), self.reduce2(states[-1])]
        for k in range(0, len(self.indices), 2):
            first = getattr(self, f'operations_{k}')
            second = getattr(self, f'operations_{k + 1}')
            hidden.append(first(hidden[self.indices[k]]) + second(hidden[self.indices[k + 1]]))
        return torch.cat([hidden[i] for i in self.concat], dim=1), states[0]


class Classify(nn.Module):
    """Pools the last cell's output globally and classifies it."""

    def __init__(self, channels_prev: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(channels_prev, num_classes)

    def forward(self, states: States) -> Tensor:  # type: ignore
        return self.fc(F.adaptive_avg_pool2d(states[0], (1, 1)).flatten(1))


def amoebanetd(num_layers: int = 18, num_filters: int = 256,
               num_classes: int = 1000) -> nn.Sequential:
    """AmoebaNet-D (L, D): L = num_layers normal cells (a multiple of 3), D = num_filters (the
    stem has D / 4 channels, at least 8). Takes N x 3 x H x W images, any size from 32 x 32.
    Raises ValueError for a bad size."""
    if not (num_layers > 0 and num_layers % 3 == 0):
        raise ValueError('AmoebaNet-D needs a positive multiple of 3 normal cells '
                         f'(num_layers {num_layers})')
    if not (num_filters >= 8 and num_classes > 0):
        raise ValueError('AmoebaNet-D needs num_filters >= 8 and num_classes > 0 '
                         f'(num_filters {num_filters}, num_classes {num_classes})')
    repeat = num_layers // 3
    channels = num_filters // 4
    channels_prev_prev = channels_prev = channels
    reduction_prev = False
    model: 'OrderedDict[str, nn.Module]' = OrderedDict()

    # Each cell reads the two before it: track their widths.
    def add_cell(name: str, reduction: bool) -> None:
        nonlocal channels_prev_prev, channels_prev, reduction_prev
        cell = Cell(channels_prev_prev, channels_prev, channels, reduction, reduction_prev)
        channels_prev_prev = channels_prev
        channels_prev = channels * len(cell.concat)
        reduction_prev = reduction
        model[name] = cell

    def add_reduction(name: str) -> None:
        nonlocal channels
        channels *= 2
        add_cell(name, reduction=True)

    def add_normals(group: str) -> None:
        for k in range(repeat):
            add_cell(f'{group}_normal{k + 1}', reduction=False)

    model['stem1'] = Stem(channels)
    add_reduction('stem2')
    add_reduction('stem3')
    add_normals('cell1')
    add_reduction('cell2_reduction')
    add_normals('cell3')
    add_reduction('cell4_reduction')
    add_normals('cell5')
    model['classify'] = Classify(channels_prev, num_classes)
    return nn.Sequential(model)
