"""Writes tests/data/eval/: small multiple-choice and LAMBADA files in the formats evaluate.py reads.

    python tests/data/make_eval_fixtures.py

Real benchmarks cannot be downloaded here, so the tests score these: a few sentences written for
the purpose, in HellaSwag's shape as lm-eval gives it ({"context", "choices", "answer"}) and in
OpenAI's LAMBADA shape ({"text"}: the last word is the one to predict). With the tiny random
model the answers mean nothing; the tests hold evaluate.py's arithmetic, not the model's wisdom.
"""
import json
import os

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "eval")

CHOICE = [
    {"context": "The cat sat on the", "choices": [" mat", " moon", " very large and comfortable sofa"], "answer": 0},
    {"context": "She poured the coffee into a ", "choices": ["cup", "shoe"], "answer": 0},
    {"context": "", "choices": ["Hello", "Goodbye, and thank you"], "answer": 1},
    {"context": "Two plus two is", "choices": [" four", " five", " fish", " 4"], "answer": 3},
    {"context": "He opened the door\tand", "choices": [" walked in", " flew"], "answer": 0},
]

LAMBADA = [
    "the old man looked at the sea for a long time and then he went back to his boat",
    "she had always wanted to see the mountains , so that summer she finally went to the mountains",
    "when the music stopped everyone turned to look at the piano",
    "he said nothing at all",
    "in the morning the birds began to sing outside the window",
]


def write_jsonl(name, rows):
    with open(os.path.join(HERE, name), "w", encoding="utf-8", newline="\n") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    os.makedirs(HERE, exist_ok=True)
    write_jsonl("choice.jsonl", CHOICE)
    write_jsonl("lambada.jsonl", [{"text": text} for text in LAMBADA])
