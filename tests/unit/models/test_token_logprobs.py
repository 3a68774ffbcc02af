"""``forward.token_logprobs``: the sampled tokens' log-probs and their gradient, chunked and padding-skipping, against
the plain autograd expression it replaces (``gather - logsumexp``, then the padding masked)."""

import pytest
import torch

from groupwise.models import forward
from groupwise.models.forward import Packed, _from_logits, token_logprobs


def reference(x, ids, lengths, temperature=1.0):
    z = x.float()
    z = z / temperature if temperature != 1.0 else z
    lp = z.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)
    mask = torch.arange(x.shape[1]) < lengths.unsqueeze(1)
    return lp.masked_fill(~mask, 0.0)


def case(b=3, t=70, v=101, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    big = torch.randn(b, t + 1, v, generator=g) * 4  # a view of a larger tensor, as out.logits[:, :-1] is
    x = big.to(dtype)[:, :-1]
    ids = torch.randint(0, v, (b, t), generator=g)
    lengths = torch.tensor([t, 0, 37][:b])  # a whole row, an empty one, one ending inside the second chunk
    w = torch.randn(b, t, generator=g)
    return x, ids, lengths, w


def ours(x, ids, lengths, temperature=1.0):
    return token_logprobs(x, ids, lengths, temperature)[0]


def grads(fn, x, ids, lengths, w, temperature):
    x = x.detach().clone().requires_grad_()
    y = fn(x, ids, lengths, temperature)
    (y * w).sum().backward()
    return y.detach(), x.grad


@pytest.mark.parametrize("chunk", [None, 1, 7, 200])  # None: this machine's; 200: a whole row (an accelerator's)
def test_equals_the_autograd_expression_bitwise_in_fp32(chunk, monkeypatch):
    if chunk is not None:
        monkeypatch.setattr(forward, "_chunk", lambda logits: chunk)
    x, ids, lengths, w = case()
    y, dx = grads(ours, x, ids, lengths, w, 1.0)
    y0, dx0 = grads(reference, x, ids, lengths, w, 1.0)
    assert torch.equal(y, y0) and torch.equal(dx, dx0)
    assert float(y.abs().sum()) > 10 and float(dx.abs().sum()) > 1  # neither side is trivially zero
    assert (dx[1] == 0).all() and (dx[2, 37:] == 0).all() and (y[2, 37:] == 0).all()
    assert (dx[2, :37] != 0).any(dim=-1).all()  # every real position gets a gradient


@pytest.mark.parametrize("dtype,temperature,tol", [(torch.float32, 0.7, 1e-6), (torch.bfloat16, 1.0, 1e-6),
                                                   (torch.bfloat16, 1.3, 1e-6)])
def test_temperature_and_bf16_logits(dtype, temperature, tol):
    x, ids, lengths, w = case(dtype=dtype, seed=1)
    y, dx = grads(ours, x, ids, lengths, w, temperature)
    y0, dx0 = grads(reference, x, ids, lengths, w, temperature)
    assert y.dtype == torch.float32 and dx.dtype == dtype
    torch.testing.assert_close(y, y0, atol=tol, rtol=tol)
    torch.testing.assert_close(dx.float(), dx0.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_entropy_is_the_whole_log_softmax_s(temperature):
    x, ids, lengths, _ = case(seed=4)
    lp, ent = token_logprobs(x, ids, lengths, temperature, with_entropy=True)
    z = x / temperature if temperature != 1.0 else x
    logp = z - torch.logsumexp(z, dim=-1).unsqueeze(-1)
    want = -(logp.exp() * logp).sum(-1).masked_fill(~(torch.arange(x.shape[1]) < lengths.unsqueeze(1)), 0.0)
    assert torch.equal(ent, want) and float(ent.sum()) > 1.0
    assert torch.equal(lp, ours(x, ids, lengths, temperature))  # asking for it changes nothing else
    assert token_logprobs(x, ids, lengths, temperature)[1] is None


def test_no_second_derivative():
    x, ids, lengths, _ = case(seed=5)
    x = x.detach().clone().requires_grad_()
    (g,) = torch.autograd.grad(ours(x, ids, lengths).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):  # once_differentiable: an error, not a silently wrong Hessian
        g.sum().backward()


def test_parts_join_along_the_completion():
    # the shared-prefix pass hands the prompt's last logits apart from the completion's: the same Forward as joined
    x, ids, lengths, w = case(seed=2)
    mask = torch.arange(x.shape[1]) < lengths.unsqueeze(1)
    packed = Packed(ids, mask.long(), mask.long(), ids, mask, 0)
    whole = _from_logits([x], packed, 0.9, True, True)
    split = _from_logits([x[:, :1], x[:, 1:]], packed, 0.9, True, True)
    assert torch.equal(whole.logprobs, split.logprobs)
    assert torch.equal(whole.entropy, split.entropy) and torch.equal(whole.vocab_logprobs, split.vocab_logprobs)
    torch.testing.assert_close(whole.logprobs, reference(x, ids, lengths, 0.9), atol=1e-6, rtol=1e-6)


def test_a_mask_that_is_not_a_prefix_is_still_masked():
    x, ids, _, _ = case(seed=3)
    mask = torch.ones(ids.shape, dtype=torch.bool)
    mask[0, 5] = False  # a hole (no caller makes one today): every position computed, the hole zeroed after
    packed = Packed(ids, mask.long(), mask.long(), ids, mask, 0)
    got = _from_logits([x], packed, 1.0, False, False).logprobs
    want = reference(x, ids, torch.full((3,), x.shape[1])).masked_fill(~mask, 0.0)
    assert torch.equal(got, want)
