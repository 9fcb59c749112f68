"""What can a peer buy with the numbers it claims? Liar vs honest sender, per external objective.

One update of the real tiny model on one group of ours (8 completions) plus one peer group of the
same 8 texts and rewards (one right), sent four ways:
    tier2        no log-probs: the receiver's own numbers, ratio 1 (SAPO's treatment)
    honest       tier 0 with the behavior log-probs of a stale sender (our weights plus noise)
    liar_low     tier 0 claiming b = -20 on every token ("my text was very unlikely")
    liar_under   tier 0 claiming the honest b minus 3 nats per token
For each external objective (and PPO-style ones with loss.off_policy.proximal = behavior) the
table gives the mean gradient weight of the peer's tokens, |dL/dl_t| * N / |A_i| (1 for an
on-policy token under token-mean GRPO), and the gradient norm of the update before clipping.
Negative damping is off here (kappa = 1 on every tier) so that the columns differ only in b.

Then group size: the same 8 completions sent as a group of 64 (each eight times), and one right
answer among 64 vs one among 8, as the peer group's share of the batch's gradient mass
sum |dL/dl| (ours + the peer's = 1).

    .venv/bin/python -m scripts.experiments.peer_influence            # about a minute on 2 cores
    .venv/bin/python -m scripts.experiments.peer_influence --quick    # smoke: two objectives

Writes <out>/exp_peer_influence.json and .png (default runs/exp_peer_influence). It calls
Learner.update and reads the loss inputs the learner builds through its extension point
`Learner.observe_loss`, nothing private.
"""
from __future__ import annotations

from pathlib import Path

import torch

from policy.learner import Learner, OffPolicyConfig, OptimConfig
from policy.logprobs import completion_logprobs, pad_batch
from policy.losses import make_objective
from policy.models import ModelConfig, load_policy
from policy.types import TrainGroup, TrainSample
from scripts.common import arg_parser, command_line, pyplot, runs_dir, write_result

PROMPT = [1, 5, 13]  # bos '2' '='
PEER_TEXTS = [[3 + i, 4 + i % 3, 5] for i in range(8)]
OWN_TEXTS = [[6 + i % 4, 7, 4] for i in range(8)]
ONE_RIGHT = [1.0] + [0.0] * 7
SENDERS = ("tier2", "honest", "liar_low", "liar_under")
OBJECTIVES = [("minpro", "receiver"), ("cispo", "receiver"), ("prefix", "receiver"), ("ftis", "receiver"),
              ("tis(grpo)", "receiver"), ("grpo", "behavior"), ("dapo", "behavior"), ("gspo", "behavior")]


class GradientWatch(Learner):
    """A Learner that keeps, of its last backward, |dL/dl| per token and what it needs to weigh it."""

    seen: dict = {}

    def observe_loss(self, x, tier, loss) -> None:
        grad = torch.autograd.grad(loss, x.logp, retain_graph=True)[0].abs()  # [B, C]
        self.seen = dict(grad=grad * x.mask, mask=x.mask, adv=x.advantages.abs(), peer=tier >= 0)


def make_learner(external: str, proximal: str) -> GradientWatch:
    torch.manual_seed(0)
    policy = load_policy(ModelConfig(name="tiny"))
    return GradientWatch(policy.model, make_objective("grpo"), OptimConfig(lr=1e-2), pad_id=0, temperature=1.0,
                         external_objective=make_objective(external), completion_budget=3, group_size=8,
                         off_policy=OffPolicyConfig(proximal=proximal, neg_damping=1.0, sender_logprobs=True,
                                                    peer_failures="train"))


def stale_logprobs(texts: list[list[int]]) -> list[list[float]]:
    """Honest behavior log-probs of a stale sender: the receiver's initial weights plus noise."""
    torch.manual_seed(0)
    model = load_policy(ModelConfig(name="tiny")).model
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))  # [*p.shape]
        ids, attn, _ = pad_batch([PROMPT] * len(texts), texts, pad_id=0)  # [n, P+C]
        lp = completion_logprobs(model.eval(), ids, attn, 3, 1.0)  # [n, 3]
    return lp.tolist()


def peer_group(sender: str, rewards: list[float], texts: list[list[int]], honest: list[list[float]]) -> TrainGroup:
    samples = []
    for i, r in enumerate(rewards):
        text = texts[i % len(texts)]
        if sender == "tier2":
            samples.append(TrainSample(PROMPT, text, None, r, tier=2))
            continue
        b = {"honest": honest[i % len(texts)], "liar_low": [-20.0] * 3,
             "liar_under": [x - 3.0 for x in honest[i % len(texts)]]}[sender]
        samples.append(TrainSample(PROMPT, text, b, r, tier=0))
    return TrainGroup(samples)


def own_group() -> TrainGroup:
    return TrainGroup([TrainSample(PROMPT, t, None, r) for t, r in zip(OWN_TEXTS, [1.0, 0.0, 0.0, 1.0] * 2)])


def measure(external: str, proximal: str, peer: TrainGroup) -> dict:
    """One update; the per-token gradient of the loss w.r.t. l, split into our rows and the peer's."""
    learner = make_learner(external, proximal)
    stats = learner.update([own_group(), peer])
    grad, mask, adv, is_peer = (learner.seen[k] for k in ("grad", "mask", "adv", "peer"))
    n_tok = float(mask.sum())
    weight = grad * n_tok / adv.clamp_min(1e-12)[:, None]  # [B, C] 1 = an on-policy GRPO token
    peer_mask = mask[is_peer] > 0  # [b', C]
    return {"peer_weight_mean": float(weight[is_peer][peer_mask].mean()),
            "peer_grad_share": float(grad[is_peer].sum() / grad.sum()),
            "grad_norm": float(stats["grad_norm"])}


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    rows = result["weights"]
    names = [f"{r['objective']}\n({r['proximal']})" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 4))
    width = 0.8 / len(SENDERS)
    for k, sender in enumerate(SENDERS):
        ax.bar([i + k * width for i in range(len(rows))], [r[sender]["peer_weight_mean"] for r in rows], width,
               label=sender)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], names, fontsize=7)
    ax.set_ylabel("mean gradient weight of the peer's tokens")
    ax.set_title("what a peer's claimed log-probs buy (1 = on-policy token)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    p = arg_parser(__spec__, __doc__)
    p.add_argument("--quick", action="store_true", help="smoke: two objectives")
    p.add_argument("--out", default=str(runs_dir("exp_peer_influence")))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    objectives = OBJECTIVES[:1] + OBJECTIVES[5:6] if args.quick else OBJECTIVES
    honest = stale_logprobs(PEER_TEXTS)
    weights = []
    for external, proximal in objectives:
        row = {"objective": external, "proximal": proximal}
        for sender in SENDERS:
            row[sender] = measure(external, proximal, peer_group(sender, ONE_RIGHT, PEER_TEXTS, honest))
        weights.append(row)
        print(f"{external:10s} {proximal:9s} " + "  ".join(
            f"{s} {row[s]['peer_weight_mean']:.3f} (|g| {row[s]['grad_norm']:.3g})" for s in SENDERS), flush=True)
    sizes = {
        "eight_of_8": measure("minpro", "receiver", peer_group("tier2", ONE_RIGHT, PEER_TEXTS, honest)),
        "copies_64": measure("minpro", "receiver", peer_group("tier2", ONE_RIGHT * 8, PEER_TEXTS, honest)),
        "one_of_64": measure("minpro", "receiver", peer_group("tier2", [1.0] + [0.0] * 63, PEER_TEXTS, honest)),
    }
    for name, m in sizes.items():
        print(f"group size {name:10s} peer share of the gradient mass {m['peer_grad_share']:.3f}", flush=True)
    result = {"weights": weights, "group_sizes": sizes, "command": command_line(__spec__, argv)}
    out = Path(args.out)
    write_result(out, "exp_peer_influence", result, plot)
    print(f"wrote {out}/exp_peer_influence.json and .png")
    return result


if __name__ == "__main__":
    main()
