"""Exercises for a class: write a copy of the project with some functions left for the student.

    python handout.py --list                  # the exercises, their functions and their tests
    python handout.py class/ 1 4 9            # a copy with exercises 1, 4 and 9 to do
    python handout.py class/                  # every exercise

In the copy, each chosen function keeps its signature and docstring, and its body is
`raise NotImplementedError("exercise N: ...")`. The student writes it and runs the
exercise's tests, in the copy, with the README's one command:

    python -m pytest -q -k NAME

A test (tests/test_exercises.py) blanks each exercise in turn and checks that its tests
then fail, naming the exercise, and pass again with the function restored.
"""
import argparse
import ast
import os
import shutil
import sys

from errors import UserError, fail

HERE = os.path.dirname(os.path.abspath(__file__))

# number: (title, [(file, function)], [tests]). The README's "Exercises" names the same tests.
EXERCISES = {
    1: ("gelu, softmax, layer_norm",
        [("gpt2_numpy.py", "gelu"), ("gpt2_numpy.py", "softmax"), ("gpt2_numpy.py", "layer_norm")],
        ["test_gelu_is_the_tanh_approximation", "test_softmax_matches_the_definition_and_does_not_overflow",
         "test_layer_norm_matches_the_definition"]),
    2: ("attention",
        [("gpt2_numpy.py", "attention_scores"), ("gpt2_numpy.py", "attention_weights"), ("gpt2_numpy.py", "attention")],
        ["test_attention_matches_the_loop", "test_attention_weights_rows_sum_to_one_and_never_look_ahead"]),
    3: ("multi-head attention",
        [("gpt2_numpy.py", "split_heads"), ("gpt2_numpy.py", "merge_heads"), ("gpt2_numpy.py", "mha")],
        ["test_split_and_merge_heads", "test_mha_matches_per_head_loops", "test_logits_match_hugging_face"]),
    4: ("the KV cache", [("gpt2_numpy.py", "kv_append")],
        ["test_kv_cache_gives_the_logits_of_full_recomputation_at_every_step"]),
    5: ("blocked attention", [("gpt2_numpy.py", "blocked_attention")], ["test_blocked_attention_equals_attention"]),
    6: ("sampling",
        [("gpt2_numpy.py", "top_k_filter"), ("gpt2_numpy.py", "top_p_filter"), ("gpt2_numpy.py", "sample_next")],
        ["test_top_k_keeps_the_k_largest", "test_top_p_keeps_the_smallest_set_reaching_p",
         "test_sampling_follows_the_probabilities"]),
    7: ("counting parameters", [("parameters.py", "count_parameters")], ["test_gpt2_totals", "test_124m_parts"]),
    8: ("why wteᵀ", [("parameters.py", "count_tensors")], ["test_the_formula_agrees_with_the_checkpoint_tensors"]),
    9: ("BPE merges", [("bpe.py", "merge_once"), ("bpe.py", "merge")],
         ["test_one_merge_joins_the_pair_with_the_lowest_rank", "test_merges_match_the_classic_algorithm",
          "test_the_fast_merge_equals_merge"]),
    10: ("reading a checkpoint", [("checkpoint.py", "read_varint"), ("checkpoint.py", "read_footer")],
         ["test_read_varint", "test_footer_has_the_magic_and_two_handles"]),
    11: ("CRC-32C", [("crc32c.py", "crc32c_by_bits")], ["test_crc32c_definition_gives_the_known_answers"]),
    12: ("the transformer block", [("gpt2_numpy.py", "transformer_block")],
         ["test_every_stage_matches_hugging_face"]),
    13: ("the logit lens", [("look_inside.py", "logit_lens")],
         ["test_the_logit_lens_matches_hugging_faces_ln_f_and_head", "test_the_last_layers_lens_is_the_models_prediction"]),
    14: ("previous-token and induction heads",
         [("look_inside.py", "previous_token_scores"), ("look_inside.py", "induction_targets"),
          ("look_inside.py", "induction_scores")],
         ["test_previous_token_scores_on_patterns_built_by_hand", "test_induction_scores_on_patterns_built_by_hand",
          "test_induction_and_previous_token_scores_on_the_models_cache"]),
    15: ("ablating a head", [("look_inside.py", "zero_ablate_head"), ("look_inside.py", "loss")],
         ["test_ablating_one_head_changes_only_its_share_of_the_attention_output",
          "test_ablating_a_head_changes_the_loss_and_the_plain_loss_is_scores"]),
    16: ("LayerNorm's backward", [("train.py", "layer_norm_backward")], ["test_layer_norm_backward_by_finite_differences"]),
    17: ("attention's backward", [("train.py", "softmax_backward"), ("train.py", "attention_backward")],
         ["test_softmax_backward_by_finite_differences", "test_attention_backward_with_its_mask_by_finite_differences"]),
    18: ("the tied wte", [("train.py", "loss_and_grads")],
         ["test_the_tied_wte_gets_its_gradient_from_both_the_gather_and_the_logits", "test_every_gradient_matches_torch"]),
}

SKIP = shutil.ignore_patterns(".git", "models", "out", "__pycache__", ".pytest_cache", "*.part")


def function_node(tree, name):
    """The def of `name`, at the top level of a module or in one of its classes."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"no function {name}")


def blank(source, name, message):
    """source with the body of function `name` replaced by `raise NotImplementedError(message)`,
    its signature and docstring kept."""
    node = function_node(ast.parse(source), name)
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    lines = source.splitlines(keepends=True)
    indent = " " * body[0].col_offset if body else " " * (node.col_offset + 4)
    first = body[0].lineno - 1 if body else node.body[0].end_lineno
    return "".join(lines[:first] + [f"{indent}raise NotImplementedError({message!r})\n"] + lines[node.end_lineno:])


def exercise_message(number, function):
    title, _, tests = EXERCISES[number]
    return f"exercise {number} ({title}): write {function}; then run python -m pytest -q -k {tests[0]}"


def write_handout(out, numbers, root=HERE):
    """Copy the project at root to out, with the functions of the exercises `numbers` blanked."""
    unknown = [n for n in numbers if n not in EXERCISES]
    if unknown:
        raise UserError(f"no exercise {unknown[0]}: choose from 1 to {max(EXERCISES)}")
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise UserError("already exists and is not an empty folder: choose a new one", path=out)
    inside = os.path.abspath(out)

    def ignore(folder, names):  # what never goes in a copy, and the copy itself if it lies inside root
        return set(SKIP(folder, names)) | {n for n in names if os.path.abspath(os.path.join(folder, n)) == inside}

    shutil.copytree(root, out, ignore=ignore, dirs_exist_ok=True)
    for number in numbers:
        for file, function in EXERCISES[number][1]:
            path = os.path.join(out, file)
            with open(path, encoding="utf-8") as f:
                source = f.read()
            with open(path, "w", encoding="utf-8") as f:
                f.write(blank(source, function, exercise_message(number, function)))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description="Write a copy of the project with exercises left to do.")
    p.add_argument("out", nargs="?", help="a new (or empty) folder for the copy")
    p.add_argument("numbers", nargs="*", type=int, help="the exercises (default: all)")
    p.add_argument("--list", action="store_true", help="list the exercises")
    p.error = fail
    args = p.parse_args(argv)
    if args.list or not args.out:
        for number, (title, functions, tests) in EXERCISES.items():
            print(f"{number:>2}. {title}: {', '.join(f for _, f in functions)}  (tests: {', '.join(tests)})")
        return 0
    try:
        write_handout(args.out, args.numbers or list(EXERCISES))
    except UserError as e:
        fail(str(e))
    print(f"{args.out}: exercises {', '.join(map(str, args.numbers or EXERCISES))} to do; "
          f"run the tests there with python -m pytest -q -k NAME")
    return 0


if __name__ == "__main__":
    sys.exit(main())
