import pytest
import torch

from workbench.train.loop import adamw, train_steps, warmup_linear


def test_warmup_then_linear_decay():
    factors = [warmup_linear(s, 10, 2) for s in range(10)]
    assert factors[:2] == [0.5, 1.0]
    assert factors[2:] == pytest.approx([8 / 8, 7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8])


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(2, 2)
        self.head = torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def test_fresh_head_gets_its_own_rate_and_the_loop_lowers_the_loss():
    torch.manual_seed(0)
    model = _Tiny()
    opt = adamw(model, lr=1e-2, head_lr=1e-1)
    assert [g["base_lr"] for g in opt.param_groups] == [1e-2, 1e-1]
    x = torch.randn(64, 2)
    y = x.sum(1, keepdim=True)
    batches = iter(lambda: (x, y), None)

    def step_loss(m, batch):
        inputs, target = batch
        loss = torch.nn.functional.mse_loss(m(inputs), target)
        loss.backward()
        return loss

    losses = train_steps(model, batches, 60, opt, step_loss, progress=False)
    assert len(losses) == 60 and losses[-1] < 0.2 * losses[0]
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * 1 / 54)      # the last step's decayed rate
    assert not model.training
