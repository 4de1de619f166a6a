"""Write data/spam_mini.jsonl and data/spam_mini_test.jsonl: short text messages labelled "spam" or "ham",
written for this project (public domain, as the rest of it), in the spirit of the SMS Spam Collection that
rasbt's "LLMs from scratch" chapter 6 classifies. Each message is a phrase from each of its label's lists,
drawn with a seed; the test file's messages are drawn apart from the training file's, and no message is
in both. docs/fine_tuning.md trains a classifier on them.

    python data/make_spam_mini.py
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
SPAM = (["WINNER!", "Congratulations!", "URGENT:", "Free entry:", "Final notice:", "You have been selected!",
         "Claim now:", "Exclusive offer:", "Act fast!", "Dear customer,"],
        ["you have won a 1000 cash prize", "your mobile number won a free holiday", "a new phone is yours for free",
         "get 50% off every ringtone", "your account is due a refund of 250", "earn 500 a week from home",
         "a guaranteed loan is waiting", "your prize draw ticket is confirmed", "cheap meds delivered tonight",
         "you are owed a bonus reward"],
        ["text WIN to 80082 now.", "call 09061 701 461 to claim.", "reply YES before midnight.",
         "click the link to collect.", "send your bank details today.", "offer ends in 24 hours.",
         "txt STOP to opt out, 150p/msg.", "visit www.prize-now.biz to claim.", "call free on 0800 542 0825.",
         "limited time only, act now."])
HAM = (["Hey,", "Hi mum,", "Sorry,", "Ok,", "Morning!", "Quick one:", "Thanks,", "Hiya,", "So,", "Listen,"],
       ["I'll be home a bit late tonight", "are we still on for lunch tomorrow", "can you pick up some milk",
        "the train is running twenty minutes late", "I left my keys at your place", "did you see the match last night",
        "the meeting moved to Thursday", "dinner is in the oven", "I finished the report early",
        "your parcel came this morning"],
       ["see you soon.", "let me know.", "no rush.", "talk later x", "love you.", "call me when you can.",
        "cheers.", "hope that's ok.", "back by six.", "speak tomorrow."])


def messages(parts, rng, n, avoid=()):
    out = set()
    while len(out) < n:
        m = " ".join(rng.choice(p) for p in parts)
        if m not in avoid:
            out.add(m)
    return sorted(out)


def write(path, rows, rng):
    rng.shuffle(rows)  # the labels mixed: validation holds out the last lines
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": text, "label": label}) + "\n" for text, label in rows)


def main():
    rng = random.Random(6)
    train = [(m, "spam") for m in messages(SPAM, rng, 120)] + [(m, "ham") for m in messages(HAM, rng, 120)]
    seen = {m for m, _ in train}
    test = [(m, "spam") for m in messages(SPAM, rng, 50, seen)] + [(m, "ham") for m in messages(HAM, rng, 50, seen)]
    write(os.path.join(HERE, "spam_mini.jsonl"), train, rng)
    write(os.path.join(HERE, "spam_mini_test.jsonl"), test, rng)


if __name__ == "__main__":
    main()
