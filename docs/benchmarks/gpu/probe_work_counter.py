"""WorkCounter: one TorchDispatchMode that counts, per step, the aten ops, FLOPs and
collectives (by kind, calls and bytes) that run in *this* process.

Bytes convention (nccl-tests' "size"): the full, unsharded buffer of the collective, i.e. the
largest of its tensor arguments/results: all_gather = gathered output, reduce_scatter = the
full input, all_reduce/broadcast/send/recv = the tensor, all_to_all = the send buffer.
Implemented as max(sum of nbytes per argument group, sum of nbytes of the result), which
picks exactly that for every c10d.* (in-place, buffers passed as args) and
_c10d_functional.* (functional, output returned) op.
"""

import collections

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

# op name (namespace::name, no overload) -> kind
KIND = {}
for _k, _names in {
    "all_gather": [
        "c10d::_allgather_base_",
        "c10d::allgather_",
        "c10d::allgather_coalesced_",
        "c10d::allgather_into_tensor_coalesced_",
        "_c10d_functional::all_gather_into_tensor",
        "_c10d_functional::all_gather_into_tensor_out",
        "_c10d_functional::all_gather_into_tensor_coalesced",
    ],
    "reduce_scatter": [
        "c10d::_reduce_scatter_base_",
        "c10d::reduce_scatter_",
        "c10d::reduce_scatter_tensor_coalesced_",
        "_c10d_functional::reduce_scatter_tensor",
        "_c10d_functional::reduce_scatter_tensor_out",
        "_c10d_functional::reduce_scatter_tensor_coalesced",
    ],
    "all_reduce": [
        "c10d::allreduce_",
        "c10d::allreduce_coalesced_",
        "_c10d_functional::all_reduce",
        "_c10d_functional::all_reduce_",
        "_c10d_functional::all_reduce_coalesced",
        "_c10d_functional::all_reduce_coalesced_",
    ],
    "broadcast": [
        "c10d::broadcast_",
        "_c10d_functional::broadcast",
        "_c10d_functional::broadcast_",
    ],
    "all_to_all": [
        "c10d::alltoall_",
        "c10d::alltoall_base_",
        "_c10d_functional::all_to_all_single",
        "_dtensor::shard_dim_alltoall",
    ],
    "send": ["c10d::send", "_c10d_functional::isend"],
    "recv": ["c10d::recv_", "c10d::recv_any_source_", "_c10d_functional::irecv"],
    "reduce": ["c10d::reduce_"],
    "gather": ["c10d::gather_"],
    "scatter": ["c10d::scatter_"],
    "barrier": ["c10d::barrier", "c10d::monitored_barrier_"],
    "batch_p2p": ["_c10d_functional::batch_p2p_ops"],
}.items():
    for _n in _names:
        KIND[_n] = _k
# legacy py funcol names map the same way
for _n, _k in list(KIND.items()):
    if _n.startswith("_c10d_functional::"):
        KIND["c10d_functional::" + _n.split("::")[1]] = _k
WAIT = {"_c10d_functional::wait_tensor", "c10d_functional::wait_tensor"}


# flop_registry (torch 2.13) lacks the CPU SDPA kernel; its shapes match the CUDA flash op.
_FLOPS = dict(flop_registry)
if hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
    _FLOPS[torch.ops.aten._scaled_dot_product_flash_attention_for_cpu] = flop_registry[
        torch.ops.aten._scaled_dot_product_flash_attention
    ]


def _nbytes(x):
    return sum(t.numel() * t.element_size() for t in tree_leaves(x) if isinstance(t, torch.Tensor))


def coll_bytes(args, kwargs, out):
    groups = [_nbytes(a) for a in args] + [_nbytes(v) for v in kwargs.values()] + [_nbytes(out)]
    return max(groups) if groups else 0


class WorkCounter(TorchDispatchMode):
    """Count per step. Use `step(name)` to start a new step; `steps` is a list of dicts."""

    def __init__(self, flops=True):
        super().__init__()
        self.flops = flops
        self.steps = []
        self.step("setup")

    def step(self, name):
        self.cur = {
            "name": name,
            "ops": collections.Counter(),
            "aten_ops": 0,
            "flops": 0,
            "coll": collections.defaultdict(lambda: [0, 0]),
            "coll_ops": collections.Counter(),
            "waits": 0,
        }
        self.steps.append(self.cur)
        return self.cur

    _info = {}  # func -> (name, kind, is_aten, flop_fn); cached, the hot path is per op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        plain = True
        for t in types:
            if t is not torch.Tensor and t is not torch.nn.Parameter:
                # Let DTensor desugar first (NotImplemented); we then see its local ops and
                # the collectives it issues, as CommDebugMode does.
                if issubclass(t, DTensor):
                    return NotImplemented
                plain = False
        out = func(*args, **kwargs)
        if isinstance(func, torch._ops.HigherOrderOperator):
            return out
        # DTensor's sharding propagation runs ops on FakeTensors: not real work, skip.
        if not plain and any(issubclass(t, FakeTensor) for t in types):
            return out
        info = self._info.get(func)
        if info is None:
            pkt = func._overloadpacket
            name = getattr(pkt, "_qualified_op_name", str(pkt))
            info = (name, KIND.get(name), name.startswith("aten::"), _FLOPS.get(pkt))
            self._info[func] = info
        name, kind, is_aten, flop_fn = info
        c = self.cur
        c["ops"][name] += 1
        if kind is not None:
            cc = c["coll"][kind]
            cc[0] += 1
            cc[1] += 0 if kind == "barrier" else coll_bytes(args, kwargs, out)
            c["coll_ops"][name] += 1
        elif name in WAIT:
            c["waits"] += 1
        else:
            if is_aten:
                c["aten_ops"] += 1
            if self.flops and flop_fn is not None:
                c["flops"] += flop_fn(*args, **kwargs, out_val=out)
        return out

    def summary(self, skip=("setup",)):
        res = []
        for s in self.steps:
            if s["name"] in skip:
                continue
            res.append(
                {
                    "name": s["name"],
                    "aten_ops": s["aten_ops"],
                    "flops": int(s["flops"]),
                    "coll": {
                        k: {"calls": v[0], "bytes": v[1]} for k, v in sorted(s["coll"].items())
                    },
                    "coll_ops": dict(sorted(s["coll_ops"].items())),
                    "waits": s["waits"],
                    "ops_total": sum(s["ops"].values()),
                    "ops": dict(sorted(s["ops"].items())),
                }
            )
        return res


def compact(summary):
    """prefill + per-decode-token view: unique decode records with how many tokens had each."""
    pre = [s for s in summary if s["name"] == "prefill"]
    dec = [s for s in summary if s["name"].startswith("decode")]
    uniq = collections.OrderedDict()
    first = dec[0] if dec else {"ops": {}}
    for s in dec:
        key = repr({k: v for k, v in s.items() if k not in ("name", "flops")})
        uniq.setdefault(key, {"tokens": [], "rec": {k: v for k, v in s.items() if k != "name"}})
        uniq[key]["tokens"].append(int(s["name"].split(":")[1]))
    return {
        "prefill": pre[0] if pre else None,
        "decode": [
            {
                "tokens": f"{u['tokens'][0]}..{u['tokens'][-1]} ({len(u['tokens'])})",
                **u["rec"],
                "ops_vs_first": {
                    k: u["rec"]["ops"].get(k, 0) - first["ops"].get(k, 0)
                    for k in set(u["rec"]["ops"]) | set(first["ops"])
                    if u["rec"]["ops"].get(k, 0) != first["ops"].get(k, 0)
                },
            }
            for u in uniq.values()
        ],
    }
