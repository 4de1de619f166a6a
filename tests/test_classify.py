"""classify.py: a label head exactly as transformers' GPT2ForSequenceClassification computes it
(tests/data/make_classify_golden.py): the pooled positions, the logits, the loss and every gradient."""
import os

import numpy as np
import pytest

import classify
from conftest import DATA, numerical_grad
from plumbing import shapes
from plumbing.errors import UserError

GOLDEN = np.load(os.path.join(DATA, "classify_golden.npz"))
PAD = 50256


@pytest.fixture(scope="module")
def tiny_classifier(models):
    hp, params = models["tiny"]
    return hp, {**params, "score": GOLDEN["start_score"]}


def close(ours, theirs, tol=1e-5):
    """Within tol of the largest value: the issue's measure."""
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=tol * max(float(np.abs(theirs).max()), 1e-30))


def test_our_tokenizer_gives_transformers_ids_with_endoftext_as_the_special_id(encoder):
    ids, mask = GOLDEN["batch/ids"], GOLDEN["batch/attention_mask"]
    for row, m, text in zip(ids, mask, GOLDEN["texts"]):
        assert encoder.encode(str(text), allowed_special="all") == row[m == 1].tolist()


def test_the_pooled_position_is_the_last_that_is_not_a_pad_as_transformers_finds_it():
    ids = GOLDEN["batch/ids"]
    assert classify.pooled_positions(ids, PAD).tolist() == GOLDEN["batch/positions"].tolist()
    # the text that ends in <|endoftext|> is pooled at the token before it, padded or not
    row = ids[2][GOLDEN["batch/attention_mask"][2] == 1]
    assert row[-1] == PAD and classify.pooled_positions(row[None], PAD).tolist() == [len(row) - 2]
    assert classify.pooled_positions(np.full((1, 3), PAD), PAD).tolist() == [0]  # all pads: position 0
    assert classify.pooled_positions(np.array([[PAD, PAD, 5, 6]]), PAD).tolist() == [3]  # padded on the left
    assert classify.pooled_positions(np.array([[5, PAD, 6, PAD]]), None).tolist() == [3]  # no pad: the last, as it is


def test_logits_and_loss_equal_gpt2_for_sequence_classification(tiny_classifier):
    hp, params = tiny_classifier
    logits = classify.classifier_logits(GOLDEN["batch/ids"], params, hp, PAD)
    close(logits, GOLDEN["batch/logits"])
    assert classify.label_loss(logits, GOLDEN["batch/labels"]) == pytest.approx(float(GOLDEN["batch/loss"]), rel=1e-6)
    # a text alone, unpadded, has the logits it has in the padded batch
    row = GOLDEN["batch/ids"][0][GOLDEN["batch/attention_mask"][0] == 1]
    close(classify.classifier_logits(row, params, hp, PAD), GOLDEN["batch/logits"][0])


def test_every_gradient_equals_torchs_within_1e_5_of_the_largest(tiny_classifier):
    hp, params = tiny_classifier
    loss, grads, accuracy = classify.classifier_loss_and_grads(GOLDEN["batch/ids"], GOLDEN["batch/labels"], params,
                                                               hp, PAD)
    assert loss == pytest.approx(float(GOLDEN["batch/loss"]), rel=1e-6)
    flat = shapes.flatten(grads)
    assert set(flat) == set(shapes.tensor_shapes(hp)) | {"score"}
    for name, grad in flat.items():
        close(grad, GOLDEN[f"batch/{name}"])
    expected = np.mean(GOLDEN["batch/logits"].argmax(-1) == GOLDEN["batch/labels"])
    assert accuracy == pytest.approx(expected)


def test_the_head_and_its_gradient_by_finite_differences():
    """Independent of torch: the loss through pool and score, in float64, by central differences."""
    rng = np.random.default_rng(0)
    x, score, labels, positions = rng.standard_normal((3, 5, 4)), rng.standard_normal((2, 4)), np.array([0, 1, 1]), \
        np.array([4, 2, 0])

    def loss():
        return classify.label_loss(classify.pool(x, positions) @ score.T, labels)

    logits = classify.pool(x, positions) @ score.T
    dlogits = classify.label_loss_backward(logits, labels)
    np.testing.assert_allclose(dlogits.T @ classify.pool(x, positions), numerical_grad(loss, score), atol=1e-8)
    np.testing.assert_allclose(classify.pool_backward(dlogits @ score, positions, 5), numerical_grad(loss, x), atol=1e-8)


def test_a_lora_run_trains_the_adapters_and_the_whole_head(tiny_classifier):
    import train
    hp, params = tiny_classifier
    adapters = train.new_adapters(params, 2, ["c_attn"], 0)
    lora_params = train.with_adapters(params, adapters, 1.0)
    _, grads, _ = classify.classifier_loss_and_grads(GOLDEN["batch/ids"], GOLDEN["batch/labels"], lora_params, hp,
                                                     PAD, frozen=True)
    assert sorted(shapes.flatten(grads)) == sorted(list(shapes.flatten(adapters)) + ["score"])
    close(grads["score"], GOLDEN["batch/score"])  # B is 0: the model is the base, so score's gradient is torch's


def test_labels_are_numbered_sorted_and_a_classifier_needs_two():
    assert classify.label_names(["spam", "ham", "spam"]) == ["ham", "spam"]
    assert classify.label_names([3, 10, 2]) == [2, 3, 10]  # numbers in their order, not as text
    with pytest.raises(UserError, match="at least two labels; the training data has only 'spam'"):
        classify.label_names(["spam", "spam"])
    with pytest.raises(UserError, match="mix strings and whole numbers"):
        classify.label_names(["1", 2])


def test_a_new_head_starts_as_transformers_starts_it():
    score = classify.new_score(2, 768, seed=0)
    assert score.dtype == np.float32 and score.shape == (2, 768)
    assert abs(score.mean()) < 0.003 and score.std() == pytest.approx(0.02, rel=0.05)
    assert np.array_equal(score, classify.new_score(2, 768, seed=0))
