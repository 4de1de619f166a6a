"""Exercises for a class: write a copy of the project with some functions left for the student.

    python handout.py --list                  # the exercises, their functions and their tests
    python handout.py class/ 1 4 9            # a copy with exercises 1, 4 and 9 to do
    python handout.py class/                  # every exercise
    python handout.py class/ 1 9 --notebook   # and class/exercises.ipynb: a check and a program cell each
    python handout.py --progress class/ ...   # the teacher's view: done, failing, not started

The copy holds what git tracks (a .venv and the models stay behind: the message says where), but the
teacher's answers and bench/ (LEFT_BEHIND). In the copy, each chosen function keeps its signature and
docstring, and its body is `raise NotImplementedError("exercise N: ...")`. The student writes it and
runs the exercise's tests, in the copy, with the README's one command:

    python -m pytest -q -k NAME

Where the program calls a faster twin of a chosen function (TWINS below: gelu_fast
for gelu, merge_fast for merge, ...), the twin's body becomes a call to the student's
function, so the program runs what the student wrote. `python handout.py` says which
exercises each program needs done before it runs.

tests/test_handout.py blanks each exercise in turn and checks that its tests then fail,
naming the exercise, and pass with the project's own body written in; and that the program then
stops, prints something else when the function is written wrong, and prints what the whole
project prints when it is written right (and every program it is on the path of runs).
tests/test_handout_leaks.py checks that nothing else the copy holds gives a blanked exercise away
(TWINS also rewrites the forms that would).

The exercises are numbered in a course's order: the tokenizer, the data, the model, loading it,
training it, evaluating and decoding, fine-tuning, then looking inside (docs/exercises.md maps them
to Raschka's chapters, ARENA, Zero to Hero and CS336).
"""
if __name__ == "__main__":  # first, above the imports: Ctrl-C and SIGTERM are one line and 130 from here on
    from interface.start import start

    start("handout_cli")  # the command line (--list, or a copy with exercises to do)

import ast
import fnmatch
import json
import os
import shutil
import subprocess

from plumbing.errors import UserError
from plumbing.folders import check_new_folder, whole_folder

HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = "handout.json"  # in a handout: which exercises it holds ({"exercises": [1, 9], ...}), for --progress
NOTEBOOK = "exercises.ipynb"  # in a handout written with --notebook

# number: (title, [(file, function, that function's own test)], [the exercise's other tests], where a
# student sees it at work: one of WHERE's programs). docs/exercises.md names the same tests.
EXERCISES = {
    1: ("BPE merges",
        [("bpe.py", "merge_once", "test_one_merge_joins_the_pair_with_the_lowest_rank"),
         ("bpe.py", "merge", "test_merges_match_the_classic_algorithm")], ["test_the_fast_merge_equals_merge"],
        "generate"),
    2: ("training a tokenizer",
        [("bpe.py", "pair_counts", "test_pair_counts_and_merge_pair_by_hand"),
         ("bpe.py", "merge_pair", "test_pair_counts_and_merge_pair_by_hand"),
         ("bpe.py", "learn_merge", "test_learn_merge_takes_the_most_frequent_pair_and_the_first_of_a_tie")],
        ["test_the_fast_trainer_is_the_plain_one"], "from_scratch"),
    3: ("the batch of training windows",
        [("train.py", "batch", "test_a_batch_is_windows_of_the_text_and_their_next_tokens")], [], "train"),
    4: ("the embeddings",
        [("gpt2_numpy.py", "embed", "test_the_embeddings_are_each_tokens_row_plus_its_positions_row")],
        ["test_kv_cache_gives_the_logits_of_full_recomputation_at_every_step"], "lens"),
    5: ("gelu, softmax, layer_norm",
        [("gpt2_numpy.py", "gelu", "test_gelu_is_the_tanh_approximation"),
         ("gpt2_numpy.py", "softmax", "test_softmax_matches_the_definition_and_does_not_overflow"),
         ("gpt2_numpy.py", "layer_norm", "test_layer_norm_matches_the_definition")], [], "generate"),
    6: ("attention",
        [("gpt2_numpy.py", "attention_scores", "test_attention_weights_rows_sum_to_one_and_never_look_ahead"),
         ("gpt2_numpy.py", "attention_weights", "test_attention_weights_rows_sum_to_one_and_never_look_ahead"),
         ("gpt2_numpy.py", "attention", "test_attention_matches_the_loop")], [], "generate"),
    7: ("multi-head attention",
        [("gpt2_numpy.py", "split_heads", "test_split_and_merge_heads"),
         ("gpt2_numpy.py", "merge_heads", "test_split_and_merge_heads"),
         ("gpt2_numpy.py", "mha", "test_mha_matches_per_head_loops")], ["test_logits_match_hugging_face"], "generate"),
    8: ("the transformer block", [("gpt2_numpy.py", "transformer_block", "test_every_stage_matches_hugging_face")],
        ["test_the_block_passes_each_activation_through_its_hook"], "generate"),
    9: ("counting parameters", [("parameters.py", "count_parameters", "test_gpt2_totals")], ["test_124m_parts"],
        "params"),
    10: ("why wteᵀ", [("parameters.py", "count_tensors", "test_the_formula_agrees_with_the_checkpoint_tensors")], [],
         "params"),
    11: ("sampling",
         [("gpt2_numpy.py", "top_k_filter", "test_top_k_keeps_the_k_largest"),
          ("gpt2_numpy.py", "top_p_filter", "test_top_p_keeps_the_smallest_set_reaching_p"),
          ("gpt2_numpy.py", "sample_next", "test_sampling_follows_the_probabilities")], [], "generate"),
    12: ("the KV cache",
         [("gpt2_numpy.py", "kv_append", "test_kv_cache_gives_the_logits_of_full_recomputation_at_every_step")], [],
         "generate"),
    13: ("blocked attention", [("gpt2_numpy.py", "blocked_attention", "test_blocked_attention_equals_attention")], [],
         "generate"),
    14: ("reading a checkpoint",
         [("plumbing/checkpoint.py", "read_varint", "test_read_varint"),
          ("plumbing/checkpoint.py", "read_footer", "test_footer_has_the_magic_and_two_handles"),
          ("plumbing/checkpoint.py", "varint", "test_varint_is_read_varints_inverse")], [], "generate"),
    15: ("CRC-32C", [("plumbing/crc32c.py", "crc32c", "test_crc32c_definition_gives_the_known_answers")], [],
         "generate"),
    16: ("GPT-2's initialisation",
         [("parameters.py", "residual_scale", "test_the_initialisation_has_gpt2s_statistics"),
          ("parameters.py", "init_tensor", "test_the_initialisation_has_gpt2s_statistics")],
         ["test_the_same_seed_gives_the_same_weights"], "from_scratch"),
    17: ("the masked loss",
         [("backward.py", "cross_entropy", "test_the_fast_masked_loss_is_the_plain_one_and_the_reference"),
          ("backward.py", "cross_entropy_backward",
           "test_the_masked_positions_get_exactly_zero_gradient_through_the_head")],
         ["test_the_loss_is_the_mean_over_the_response_tokens_alone"], "instruction"),
    18: ("GELU's backward and the MLP's",
         [("backward.py", "gelu_backward", "test_gelu_backward_by_finite_differences"),
          ("backward.py", "ffn_backward", "test_ffn_and_transformer_block_backward_by_finite_differences")],
         ["test_gelu_backward_fast_is_gelu_backward"], "train"),
    19: ("LayerNorm's backward",
         [("backward.py", "layer_norm_backward", "test_layer_norm_backward_by_finite_differences")], [], "train"),
    20: ("attention's backward",
         [("backward.py", "softmax_backward", "test_softmax_backward_by_finite_differences"),
          ("backward.py", "attention_backward", "test_attention_backward_with_its_mask_by_finite_differences")],
         ["test_attention_backward_with_dropped_weights_by_finite_differences",
          "test_the_model_with_dropout_by_finite_differences"], "train"),
    21: ("the tied wte",
         [("backward.py", "forward_backward",
           "test_the_tied_wte_gets_its_gradient_from_both_the_gather_and_the_logits")],
         ["test_every_gradient_matches_torch"], "train"),
    22: ("AdamW", [("optimizer.py", "adamw_update", "test_adamw_update_is_the_equations")],
         ["test_ten_adamw_steps_give_torchs_losses"], "train"),
    23: ("the learning-rate schedule",
         [("optimizer.py", "learning_rate", "test_warmup_then_cosine_decay")], [], "train"),
    24: ("clipping by the global norm",
         [("optimizer.py", "grad_norm", "test_clipping_by_the_global_norm"),
          ("optimizer.py", "clip_scale", "test_clipping_by_the_global_norm"),
          ("optimizer.py", "clip_grad_norm", "test_clipping_by_the_global_norm")], [], "train"),
    25: ("one training step",
         [("train.py", "train_step", "test_one_training_step_is_forward_backward_clip_then_adamw")],
         ["test_a_step_accumulating_two_micro_batches_in_reused_buffers"], "train"),
    26: ("rolling windows",
         [("evaluate.py", "rolling_windows", "test_rolling_windows_are_lm_evals_and_predict_every_token_once")],
         ["test_perplexity_through_rolling_windows_scores_each_token_from_its_window"], "perplexity"),
    27: ("a continuation's log-likelihood",
         [("evaluate.py", "continuation_ids", "test_a_contexts_trailing_whitespace_moves_to_the_continuation")],
         ["test_loglikelihood_is_the_continuations_log_probability_given_the_context"], "lambada"),
    28: ("the repetition penalty",
         [("gpt2_numpy.py", "penalize_repeats",
           "test_the_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens")],
         ["test_greedy_with_the_processors_and_stop_strings_gives_generates_ids"], "repetition"),
    29: ("the no-repeat mask",
         [("gpt2_numpy.py", "ban_repeated_ngrams",
           "test_the_no_repeat_mask_bans_each_token_that_would_complete_an_earlier_ngram")],
         ["test_greedy_with_the_processors_and_stop_strings_gives_generates_ids"], "ngrams"),
    30: ("one step of beam search",
         [("decoding.py", "beam_step", "test_beam_step_takes_the_best_continuations_of_all_the_beams")],
         ["test_beam_search_gives_generates_sequences_and_scores"], "beams"),
    31: ("pooling at the last token that is not a pad",
         [("classify.py", "pooled_positions",
           "test_the_pooled_position_is_the_last_that_is_not_a_pad_as_transformers_finds_it")],
         ["test_logits_and_loss_equal_gpt2_for_sequence_classification"], "classify"),
    32: ("LoRA's forward",
         [("gpt2_numpy.py", "lora_update", "test_a_lora_linear_adds_the_scaled_low_rank_update")],
         ["test_the_adapters_start_as_peft_starts_them", "test_the_merged_model_is_the_base_plus_the_adapter"], "lora"),
    33: ("LoRA's backward",
         [("backward.py", "lora_linear_backward", "test_lora_linear_backward_by_finite_differences")],
         ["test_every_adapter_gradient_matches_torch"], "lora"),
    34: ("the DPO loss and its weight for each sequence",
         [("dpo.py", "dpo_loss", "test_each_sequences_weight_is_minus_the_losss_derivative_by_its_logp")],
         ["test_sigmoid_norm_is_raschkas_per_token_average", "test_the_loss_every_metric_and_every_gradient_are_trls"],
         "dpo"),
    35: ("a Q8_0 block",
         [("plumbing/gguf.py", "quantize_block", "test_a_q8_0_block_is_its_definition"),
          ("plumbing/gguf.py", "dequantize_block", "test_a_q8_0_block_is_its_definition")],
         ["test_a_q8_0_tie_rounds_away_from_zero", "test_a_q8_0_block_multiplies_by_float32_1_over_d",
          "test_q8_0_blocks_are_gguf_pys_on_awkward_rows"], "q8_0"),
    36: ("the logit lens",
         [("look_inside.py", "logit_lens", "test_the_logit_lens_matches_hugging_faces_ln_f_and_head"),
          ("look_inside.py", "lens_table", "test_the_logit_lens_matches_hugging_faces_ln_f_and_head")],
         ["test_the_last_layers_lens_is_the_models_prediction"], "lens"),
    37: ("previous-token and induction heads",
         [("look_inside.py", "previous_token_scores", "test_previous_token_scores_on_patterns_built_by_hand"),
          ("look_inside.py", "induction_targets", "test_induction_scores_on_patterns_built_by_hand"),
          ("look_inside.py", "induction_scores", "test_induction_scores_on_patterns_built_by_hand")],
         ["test_induction_and_previous_token_scores_on_the_models_cache"], "heads"),
    38: ("ablating a head",
         [("look_inside.py", "zero_ablate_head",
           "test_ablating_one_head_changes_only_its_share_of_the_attention_output"),
          ("look_inside.py", "loss", "test_ablating_a_head_changes_the_loss_and_the_plain_loss_is_scores")], [],
         "ablate"),
    39: ("the logit difference",
         [("circuits.py", "logit_difference",
           "test_the_logit_difference_is_the_answers_logit_less_the_wrong_ones_averaged_over_the_pairs")],
         ["test_the_metric_of_each_run_is_transformer_lenss"], "circuits"),
    40: ("one activation patch, as a hook",
         [("circuits.py", "patch_hook", "test_a_patch_hook_replaces_one_cell_with_the_clean_runs_and_leaves_the_rest")],
         ["test_one_cell_is_the_corrupted_run_with_that_activation_replaced_by_hand",
          "test_every_patching_sweep_is_transformer_lenss"], "patch"),
    41: ("one component's direct logit attribution",
         [("circuits.py", "dla_component",
           "test_one_components_share_is_its_centred_value_over_lnfs_scale_along_the_direction")],
         ["test_the_components_add_up_to_the_logit_difference_but_ln_fs_bias_term",
          "test_direct_logit_attribution_is_transformer_lenss"], "dla"),
    42: ("an activation's gradient",
         [("backward.py", "activation_grads", "test_every_activations_gradient_by_finite_differences")],
         ["test_every_activations_gradient_is_torchs"], "attribution"),
    43: ("an SAE's encode and decode",
         [("sae.py", "encode_pre", "test_encode_without_b_dec_on_the_input"),
          ("sae.py", "encode", "test_encode_decode_and_both_losses_equal_saelens"),
          ("sae.py", "decode", "test_encode_decode_and_both_losses_equal_saelens")],
         ["test_run_with_saes_logits_with_and_without_the_error_term"], "sae"),
    44: ("an SAE's loss",
         [("sae.py", "mse_loss", "test_encode_decode_and_both_losses_equal_saelens"),
          ("sae.py", "l1_loss", "test_encode_decode_and_both_losses_equal_saelens")],
         ["test_a_few_training_steps_equal_saelens_trainer"], "sae"),
    45: ("an SAE's backward",
         [("sae.py", "sae_backward", "test_the_backward_matches_finite_differences")],
         ["test_every_gradient_equals_saelens", "test_a_few_training_steps_equal_saelens_trainer"], "sae"),
    46: ("TopK's encode: the k largest latents, without a sort",
         [("sae.py", "topk_relu", "test_topk_keeps_k_and_needs_no_sort")],
         ["test_encode_and_decode_equal_saelenss"], "topk"),
    47: ("JumpReLU's threshold gradient",
         [("sae.py", "jumprelu_backward", "test_jumprelu_backward_is_the_straight_through_estimator")],
         ["test_every_loss_term_and_every_gradient_equal_saelens",
          "test_four_steps_equal_saelens_trainer_and_its_saved_folder"], "sae_jumprelu"),
    48: ("the ActAdd hook",
         [("steer.py", "act_add", "test_act_add_hook_adds_to_the_front_and_leaves_a_one_position_pass")],
         ["test_act_add_is_the_papers_vector_logits_and_greedy_ids"], "steer"),
    49: ("the ring all-reduce",
         [("data_parallel.py", "ring_allreduce", "test_the_ring_all_reduce_is_every_ranks_sum_on_every_rank")],
         ["test_from_scratch_zero_1_is_plain_data_parallel_and_one_process"], "data_parallel"),
    50: ("ZeRO-1's slice offsets",
         [("data_parallel.py", "bucket_slices",
           "test_zero_slices_cut_each_tensor_in_n_and_lay_a_ranks_slices_together")],
         ["test_zero_1_holds_a_ranks_slice_of_the_moments_alone"], "data_parallel"),
    51: ("the translator's reading",
         [("lens.py", "tuned_lens_logits", "test_the_translators_reading_is_tuned_lenss")],
         ["test_a_lens_tuned_lens_saved_reads_as_tuned_lens_reads_it", "test_training_steps_equal_tuned_lenss"],
         "tuned_lens"),
    52: ("the logistic loss's gradient",
         [("lens.py", "logistic_gradient", "test_the_logistic_losss_gradient_by_finite_differences")],
         ["test_probes_equal_scikit_learns_and_geometry_of_truths"], "probe"),
    53: ("one row of the adjacency",
         [("tracing.py", "adjacency_row",
           "test_one_row_of_the_adjacency_is_the_targets_gradient_contracted_with_each_sources_vector")],
         ["test_the_fast_rows_are_the_plain_row_for_each_target", "test_the_graph_is_circuit_tracers"], "graph"),
}

# The programs that run the exercises' functions, so that a student sees their own code at work.
WHERE = {"generate": 'python gpt2_numpy.py "prompt"', "params": "python gpt2_numpy.py --params MODEL",
         "lens": 'python gpt2_numpy.py --lens "text"', "heads": "look_inside.previous_token_scores and "
         "induction_scores on run_with_cache's patterns", "ablate": "look_inside.loss with a zero_ablate_head hook",
         "train": "python train.py --data FILE", "from_scratch": "python train.py --from-scratch",
         "perplexity": "python evaluate.py perplexity FILE", "lambada": "python evaluate.py lambada FILE",
         "instruction": "python train.py --data PAIRS.jsonl (instruction data)",
         "lora": "python train.py --lora-rank R",
         "dpo": "python train.py --data PREFS.jsonl (preference pairs, DPO)",
         "repetition": 'python gpt2_numpy.py --greedy --repetition-penalty 1.1 "prompt"',
         "ngrams": 'python gpt2_numpy.py --greedy --no-repeat-ngram-size 2 "prompt"',
         "beams": 'python gpt2_numpy.py --num-beams 3 "prompt"',
         "circuits": "python circuits.py logit-diff (and every experiment but heads)",
         "patch": "python circuits.py patch", "dla": "python circuits.py dla",
         "attribution": "python circuits.py attribution",
         "classify": "python evaluate.py classify FILE --model CLS",
         "q8_0": "python convert.py MODEL OUT.gguf --to gguf --gguf-type q8_0, then --model OUT.gguf",
         "sae": "sae.train_step and sae.encode on gathered activations (as python sae.py train runs them)",
         "topk": "sae.encode with a TopK SAE (as python sae.py encode --sae DIR runs one)",
         "sae_jumprelu": "sae.training_step of a JumpReLU SAE (as python sae.py train --architecture jumprelu runs it)",
         "steer": 'python steer.py add "prompt" --add A --sub B --layer L --coeff C',
         "data_parallel": "mpiexec -n 2 python train.py --data FILE, and with --zero 1 (two processes, one run)",
         "tuned_lens": "python lens.py train --data FILE",
         "probe": "python lens.py probe --method logistic",
         "graph": "tracing.attribution_graph (as python circuits.py graph runs it: its rows, adjacency_rows_fast)"}

# Each program: every exercise whose functions it calls (or the fast twins that stand for them), so
# that in a handout with one of these left to do it stops at that exercise's NotImplementedError.
# tests/test_handout.py runs each program on real text (a prompt of whole tokens never merges, so it would
# hide exercise 1), records the functions it calls, and holds this table to them.
NEEDS = {"generate": (1, 4, 5, 6, 7, 8, 11, 12, 13, 14, 15), "params": (9, 10, 14, 15),
         "lens": (1, 4, 5, 6, 7, 8, 14, 15, 36), "heads": (1, 4, 5, 6, 7, 8, 14, 15, 37),
         "ablate": (1, 4, 5, 6, 7, 8, 14, 15, 38),
         "train": (1, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 17, 18, 19, 20, 21, 22, 23, 24, 25),
         "from_scratch": (1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25),
         "perplexity": (1, 4, 5, 6, 7, 8, 13, 14, 15, 26), "lambada": (1, 4, 5, 6, 7, 8, 13, 14, 15, 27),
         "instruction": (1, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 17, 18, 19, 20, 21, 22, 23, 24, 25),
         "lora": (1, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 17, 18, 19, 20, 21, 22, 23, 24, 25, 32, 33),
         "dpo": (1, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 18, 19, 20, 21, 22, 23, 24, 25, 34),
         "repetition": (1, 4, 5, 6, 7, 8, 11, 12, 13, 14, 15, 28), "ngrams": (1, 4, 5, 6, 7, 8, 11, 12, 13, 14, 15, 29),
         "beams": (1, 4, 5, 6, 7, 8, 12, 13, 14, 15, 30), "circuits": (1, 4, 5, 6, 7, 8, 14, 15, 39),
         "patch": (1, 4, 5, 6, 7, 8, 14, 15, 39, 40), "dla": (1, 4, 5, 6, 7, 8, 14, 15, 39, 41),
         "attribution": (1, 4, 5, 6, 7, 8, 14, 15, 18, 19, 20, 39, 42),
         "classify": (1, 4, 5, 6, 7, 8, 13, 14, 15, 31), "q8_0": (1, 4, 5, 6, 7, 8, 11, 12, 13, 14, 15, 35),
         "sae": (1, 4, 5, 6, 7, 8, 14, 15, 22, 24, 43, 44, 45), "topk": (1, 4, 5, 6, 7, 8, 14, 15, 43, 46),
         "sae_jumprelu": (1, 4, 5, 6, 7, 8, 14, 15, 22, 24, 47),
         "steer": (1, 4, 5, 6, 7, 8, 11, 12, 13, 14, 15, 48),
         "data_parallel": (1, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 17, 18, 19, 20, 21, 22, 23, 24, 25, 49, 50),
         "tuned_lens": (1, 4, 5, 6, 7, 8, 14, 15, 19, 24, 51), "probe": (1, 4, 5, 6, 7, 8, 14, 15, 52),
         "graph": (1, 4, 5, 6, 7, 8, 14, 15, 53)}

# The fast twins: a form the program calls for speed, the plain functions it stands for (a test
# holds them equal), and the body it gets in a handout where one of those is an exercise (unless
# the twin is itself one of the handout's exercises). The program then runs what the student
# wrote: slower, but exactly that.
TWINS = {
    ("plumbing/gguf.py", "quantize_q8_0_fast"): (("quantize_block",), "return quantize_q8_0(x)"),
    ("plumbing/gguf.py", "dequantize_q8_0_fast"): (("dequantize_block",), "return dequantize_q8_0(raw, n)"),
    ("gpt2_numpy.py", "gelu_fast"): (("gelu",), "return gelu(x)"),
    ("gpt2_numpy.py", "layer_norm_fast"): (("layer_norm",), "return layer_norm(x, g, b, eps)"),
    ("gpt2_numpy.py", "blocked_attention_fast"): (
        ("blocked_attention", "attention", "attention_weights", "attention_scores", "softmax"),
        "return blocked_attention(q, k, v, block)"),
    ("bpe.py", "merge_fast"): (("merge_once", "merge"), "return self.merge(ids)"),
    ("bpe.py", "train_merges_fast"): (("pair_counts", "merge_pair", "learn_merge"),
                                      "return train_merges(text, n_merges, on_merge)"),
    ("plumbing/crc32c.py", "crc32c_fast"): (("crc32c",),
                              "return crc32c(data.tobytes() if isinstance(data, np.ndarray) else data)"),
    ("backward.py", "gelu_backward_fast"): (("gelu_backward", "gelu"), "return gelu_backward(x, dy)"),
    ("backward.py", "cross_entropy_fast"): (
        ("cross_entropy", "cross_entropy_backward"),
        "loss = cross_entropy(logits, targets)[0]\nlogits[...] = cross_entropy_backward(logits, targets)\nreturn loss"),
    ("optimizer.py", "adamw_step_fast"): (
        ("adamw_update", "adamw_step"),
        "for g in shapes.flatten(grads).values():\n    np.multiply(g, grad_scale, out=g)\n"
        "adamw_step(params, grads, state, lr, beta1, beta2, eps, weight_decay)"),
    ("evaluate.py", "rolling_windows_fast"): (("rolling_windows",),
                                              "yield from rolling_windows(ids, prefix_id, context, stride)"),
    ("data_parallel.py", "ring_allreduce_fast"): (("ring_allreduce",),
                                                 "ring_allreduce(comm, x)\nreturn lambda: None"),
    ("tracing.py", "adjacency_rows_fast"): (("adjacency_row",),
                                            "return adjacency_rows(grads, positions, vectors)"),
    # Not twins, but forms that would give a blanked function's answer away (tests/test_handout_leaks.py):
    # in a handout they too run the student's function. log_softmax shows softmax's max subtraction;
    # gelu_backward spells out gelu's tanh form, so it becomes the derivative of the student's gelu, by
    # central differences in float64 (within float32's rounding of the exact one); topk_mask makes TopK's
    # choice (np.where(topk_mask(h, k), ...) would be topk_relu), so it asks the student's topk_relu, of h
    # shifted above 0 in float64 (the same order; -inf, AuxK's living latents, stays out).
    ("gpt2_numpy.py", "log_softmax"): (("softmax",), "return np.log(softmax(x))"),
    ("backward.py", "gelu_backward"): (
        ("gelu",), "from gpt2_numpy import gelu  # the student's: backward.py's own lines never call it\n"
                   "x64, h = x.astype(np.float64), 1e-4\n"
                   "return (dy * ((gelu(x64 + h) - gelu(x64 - h)) / (2 * h))).astype(np.result_type(x, dy))"),
    ("sae.py", "topk_mask"): (
        ("topk_relu",), "if k <= 0 or k >= h.shape[-1]:\n    return np.full(h.shape, k > 0)\n"
                        "h64 = h.astype(np.float64)\nfinite = h64 > -np.inf\n"
                        "return topk_relu(np.where(finite, h64 - h64[finite].min() + 1.0, 0.0), k) > 0"),
}


def functions(number):
    """[(file, function)] of an exercise."""
    return [(file, function) for file, function, _ in EXERCISES[number][1]]


def tests(number):
    """Every test of an exercise: its functions' own, then the others, each once."""
    _, fns, more, _ = EXERCISES[number]
    return list(dict.fromkeys([test for _, _, test in fns] + more))


def needed_by(where):
    """The exercises whose functions run in that program (NEEDS)."""
    return list(NEEDS[where])


def spans(numbers):
    """[1, 2, 3, 5, 7, 8, 9] -> "1-3, 5, 7-9": runs of three or more as first-last."""
    runs = []
    for n in sorted(numbers):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def tracked_files(root):
    """The files git tracks in root, as paths relative to it; None when root is not a git checkout of
    the project (no git, no repository, or one that does not track handout.py: a home folder's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # root's repository, not a caller's
    try:
        r = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True, env=env, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    files = [f for f in os.fsdecode(r.stdout).split("\0") if f]
    if r.returncode != 0 or "handout.py" not in files:
        return None
    return [f for f in files if os.path.lexists(os.path.join(root, f))]  # a file deleted, not yet committed: out


# Not a git checkout (a zip, a handout's own copy): everything but these, and any virtual environment.
SKIP = shutil.ignore_patterns(".git", "models", "out", "__pycache__", ".pytest_cache", "*.part", RECORD, NOTEBOOK)
# Left behind too, as the models are: the teacher's answers (tests/wrong_answers.py's wrong answers, each
# beside the right one's line; handout.py's own tests, which write every exercise right and wrong) and bench/,
# which measures the exercises' functions against other forms of them (bench_topk.py's TopK by a sort).
LEFT_BEHIND = ("tests/wrong_answers.py", "tests/test_handout*", "bench/*")


def left_behind(path):
    """Whether a handout leaves out this file or folder (its path relative to the project)."""
    path = path.replace(os.sep, "/")
    return any(fnmatch.fnmatch(p, pattern) for p in (path, f"{path}/") for pattern in LEFT_BEHIND)


def handout_files(root, leave_out=()):
    """The files a handout of the project at root holds, relative to it: those git tracks (so a .venv,
    models/ and a class's copies stay behind), else every file but SKIP's and virtual environments'; and
    neither LEFT_BEHIND's. leave_out: absolute paths the copy without git leaves out (the copy itself,
    when it lies inside root: git tracks nothing in it, new or empty)."""
    files = tracked_files(root)
    if files is None:
        files = []
        for folder, names, found in os.walk(root):
            skip = SKIP(folder, names + found)
            names[:] = [n for n in names if n not in skip and os.path.abspath(os.path.join(folder, n)) not in leave_out
                        and not os.path.isfile(os.path.join(folder, n, "pyvenv.cfg"))]
            files += [os.path.relpath(os.path.join(folder, n), root) for n in found if n not in skip]
    return sorted(f for f in files if not left_behind(f))


def copy_project(root, to, leave_out):
    """Copy handout_files(root, leave_out) into the folder `to`."""
    for f in handout_files(root, leave_out):
        os.makedirs(os.path.dirname(os.path.join(to, f)), exist_ok=True)
        shutil.copy2(os.path.join(root, f), os.path.join(to, f), follow_symlinks=False)


def function_node(tree, name):
    """The def of `name`, at the top level of a module or in one of its classes."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"no function {name}")


def replace_body(source, name, body):
    """source with the body of function `name` (at any depth) replaced by `body` (lines, indented
    as the function's body), its signature and docstring kept."""
    node = function_node(ast.parse(source), name)
    old = node.body[1:] if ast.get_docstring(node) is not None else node.body
    lines = source.splitlines(keepends=True)
    indent = " " * old[0].col_offset if old else " " * (node.col_offset + 4)
    first = old[0].lineno - 1 if old else node.body[0].end_lineno
    new = [f"{indent}{line}\n" if line else "\n" for line in body.split("\n")]
    return "".join(lines[:first] + new + lines[node.end_lineno:])


def blank(source, name, message):
    """source with the body of function `name` replaced by `raise NotImplementedError(message)`."""
    return replace_body(source, name, f"raise NotImplementedError({message!r})")


def exercise_message(number, function):
    title = EXERCISES[number][0]
    test = next(t for _, f, t in EXERCISES[number][1] if f == function)
    return f"exercise {number} ({title}): write {function}; then run python -m pytest -q -k {test}"


def write_handout(out, numbers, root=HERE, bodies=None, record=None, more=None):
    """Copy the project at root to out, with the functions of the exercises `numbers` blanked,
    and each fast twin of a blanked function made a call to it (TWINS), and RECORD, which names
    them (with `record`'s keys): whole or not at all. bodies: {function: body} to write instead of a
    blank (a test's stand-in for a student). more(folder): writes more into the copy before it is
    whole (the notebook)."""
    unknown = [n for n in numbers if n not in EXERCISES]
    if unknown:
        raise UserError(f"no exercise {unknown[0]}: choose from 1 to {max(EXERCISES)}")
    check_new_folder(out)
    with whole_folder(out, "the handout") as tmp:
        copy_project(root, tmp, {os.path.abspath(out), os.path.abspath(tmp)})
        for file, function, body in handout_edits(numbers, bodies):
            path = os.path.join(tmp, file)
            with open(path, encoding="utf-8") as f:
                source = f.read()
            with open(path, "w", encoding="utf-8") as f:
                f.write(replace_body(source, function, body))
        with open(os.path.join(tmp, RECORD), "w", encoding="utf-8") as f:
            json.dump({"exercises": list(numbers), **(record or {})}, f, indent=1)
        if more:
            more(tmp)
    return out


def handout_edits(numbers, bodies=None):
    """[(file, function, its new body)]: each function of the exercises `numbers` blanked (or given
    bodies[function]), then each fast twin of one of them made a call to it (TWINS), unless the twin
    is itself one of the exercises' functions (it stays the student's)."""
    chosen = [(n, file, function) for n in numbers for file, function in functions(n)]
    blanked = {function for _, _, function in chosen}
    edits = [(file, function, (bodies or {}).get(function) or f"raise NotImplementedError("
              f"{exercise_message(n, function)!r})") for n, file, function in chosen]
    return edits + [(file, twin, body) for (file, twin), (plain, body) in TWINS.items()
                    if blanked & set(plain) and twin not in blanked]


def programs_waiting(numbers):
    """Which of these exercises the command line needs done before it runs, and which each other
    program needs (every one of them it calls, those of the command line included)."""
    first = [n for n in needed_by("generate") if n in numbers]
    lines = [f"{WHERE['generate']} needs exercise{'s' * (len(first) > 1)} {spans(first)} done before it runs"
             if first else f"{WHERE['generate']} runs as it is: none of these exercises is on its path"]
    lines += [f"  and {WHERE[w]} needs {spans(todo)}" for w in WHERE
              if w != "generate" and (todo := [n for n in needed_by(w) if n in numbers])]
    return lines

