import numpy as np
import pytest
import torch

from workbench.data import load_task
from workbench.elastic import finetune
from workbench.elastic.finetune import ElasticTrainConfig, train_elastic
from workbench.models.encoder import load_pretrained_encoder
from workbench.models.tokenizer import encoder_tokenizer

TINY = dict(batch_size=4, full_steps=2, importance_batches=1, elastic_steps=2, max_train=16, max_dev=8)


def test_prepared_models_have_a_full_accuracy_grid(prepared):
    for task in ("sentiment", "bbc"):                    # the elastic tasks among every mechanism's artifacts
        em = prepared[task]
        assert em.accuracy_grid.shape == (6, 12)
        assert ((em.accuracy_grid >= 0) & (em.accuracy_grid <= 1)).all()
        assert sorted(em.head_order[0].tolist()) == list(range(12))
        assert len(em.losses) == em.config.full_steps + em.config.elastic_steps


def test_accuracy_grid_matches_a_direct_evaluation(prepared):
    em = prepared["bbc"]
    dev = load_task("bbc").dev.subset(em.dev_examples)
    ids, mask = encoder_tokenizer(128)(dev.texts)
    with torch.no_grad():
        for n, m in [(6, 12), (2, 5)]:
            pred = em.encoder(ids, mask, depth=n, width=m).argmax(-1).numpy()
            assert em.accuracy_grid[n - 1, m - 1] == pytest.approx((pred == dev.labels).mean())


def test_reordering_by_importance_keeps_the_full_model_function():
    model = load_pretrained_encoder(2).eval()
    ids, mask = encoder_tokenizer(64)(["a fine film", "dull and long"])
    with torch.no_grad():
        before = model(ids, mask)
        rng = np.random.default_rng(0)
        heads, neurons = rng.random((6, 12)), rng.random((6, 1536))
        order = finetune.reorder_by_importance(model, heads, neurons)
        after = model(ids, mask)
    assert torch.allclose(before, after, atol=1e-5)
    assert order[0].tolist() == np.argsort(-heads[0]).tolist()


def test_importance_ranks_a_silenced_head_last_and_is_deterministic():
    torch.manual_seed(0)
    model = load_pretrained_encoder(2)
    with torch.no_grad():
        model.layers[0].attn_out.weight[:, 5 * 32:6 * 32] = 0.0   # head 5 of layer 0 no longer reaches the output
    batch = encoder_tokenizer(64)(["a fine film", "dull and long", "great", "awful"])
    labelled = [(*batch, torch.tensor([1, 0, 1, 0]))]
    heads, neurons = finetune.head_neuron_importance(model, labelled)
    assert heads.shape == (6, 12) and neurons.shape == (6, 1536)
    assert heads[0, 5] == 0.0 and int(np.argmin(heads[0])) == 5 and (np.delete(heads[0], 5) > 0).all()
    again, _ = finetune.head_neuron_importance(model, labelled)
    np.testing.assert_array_equal(heads, again)


def test_training_is_deterministic():
    cfg = ElasticTrainConfig(task="sentiment", **TINY)
    a, b = train_elastic(cfg, progress=False), train_elastic(cfg, progress=False)
    np.testing.assert_array_equal(a.accuracy_grid, b.accuracy_grid)
    for (name, x), (_, y) in zip(a.encoder.state_dict().items(), b.encoder.state_dict().items()):
        assert torch.equal(x, y), name
    assert a.losses == b.losses


def test_sandwich_rule_samples_the_smallest_and_never_the_full_model():
    from workbench.models.encoder import EncoderConfig

    cfg = EncoderConfig(num_layers=2, num_heads=2, hidden=8, ffn=8)
    rng = np.random.default_rng(0)
    for _ in range(50):
        subs = finetune.sample_submodels(rng, cfg, 3)
        assert subs[0] == (1, 1) and len(subs) == 4 and (2, 2) not in subs
        assert all(1 <= n <= 2 and 1 <= m <= 2 for n, m in subs)
