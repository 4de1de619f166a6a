"""Write data/speakers.jsonl: 400 lines of tiny Shakespeare (data/tinyshakespeare.txt), each a speech's heading and
first line, "JULIET:\\nO Romeo, Romeo! wherefore art thou Romeo?", labelled 1 where the speaker is a woman and 0
where a man: 200 of each, drawn with a seed from the speeches of the named women and men below (no speech twice;
a line cut at 80 characters). The probe lesson of docs/residual_stream.md reads it on the README's from-scratch
Shakespeare model: can a linear probe at a layer's last position tell who is speaking, and does pushing along its
direction change what the model writes? (The model was trained on the same text: these are lines it has seen.)

    python data/make_speakers.py
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
WOMEN = ["ISABELLA", "JULIET", "QUEEN ELIZABETH", "Nurse", "QUEEN MARGARET", "KATHARINA", "DUCHESS OF YORK",
         "PAULINA", "VOLUMNIA", "LADY ANNE", "LADY CAPULET", "HERMIONE", "MIRANDA", "BIANCA", "VIRGILIA", "PERDITA",
         "LADY GREY", "MARIANA", "MISTRESS OVERDONE", "VALERIA"]
MEN = ["GLOUCESTER", "DUKE VINCENTIO", "ROMEO", "MENENIUS", "PETRUCHIO", "CORIOLANUS", "KING RICHARD III", "LEONTES",
       "SICINIUS", "LUCIO", "KING EDWARD IV", "WARWICK", "KING RICHARD II", "BRUTUS", "BUCKINGHAM", "TRANIO", "ANGELO",
       "ESCALUS", "CAMILLO", "KING HENRY VI", "PROSPERO", "MERCUTIO", "FRIAR LAURENCE", "POLIXENES", "CAPULET"]
PER_CLASS, MOST_CHARACTERS = 200, 80


def speeches(text):
    """[(speaker, first line)] of every speech: a block after a blank line whose first line is "NAME:"."""
    found = []
    for block in text.split("\n\n"):
        lines = block.strip("\n").split("\n")
        if len(lines) >= 2 and lines[0].endswith(":") and lines[1].strip():
            found.append((lines[0][:-1], lines[1].strip()[:MOST_CHARACTERS]))
    return found


def main():
    with open(os.path.join(HERE, "tinyshakespeare.txt"), encoding="utf-8") as f:
        found = sorted(set(speeches(f.read())))
    rng = random.Random(0)
    rows = []
    for label, names in ((1, WOMEN), (0, MEN)):
        pool = [(speaker, line) for speaker, line in found if speaker in names]
        rows += [{"text": f"{speaker}:\n{line}", "label": label, "speaker": speaker}
                 for speaker, line in rng.sample(pool, PER_CLASS)]
    rng.shuffle(rows)
    with open(os.path.join(HERE, "speakers.jsonl"), "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(row) + "\n" for row in rows))
    print(f"data/speakers.jsonl: {len(rows)} lines, {PER_CLASS} a class")


if __name__ == "__main__":
    main()
