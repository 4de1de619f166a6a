"""Make docs/look_inside.png, the README's picture of the --html page. Dev-only: needs
Debian's chromium and the random-weight 124M checkpoint (`python bench/make_random_checkpoint.py 124M`).

    python docs/make_screenshot.py
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PROMPT = "The cat sat on the mat. The cat sat on the"


def main():
    with tempfile.TemporaryDirectory() as tmp:
        page = os.path.join(tmp, "page.html")
        subprocess.run([sys.executable, os.path.join(ROOT, "gpt2_numpy.py"), PROMPT, "--model",
                        os.path.join(ROOT, "bench", "out", "124M-random"), "--html", page], check=True)
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={os.path.join(tmp, 'profile')}", "--window-size=1100,1500",
                        f"--screenshot={os.path.join(HERE, 'look_inside.png')}", f"file://{page}"], check=True,
                       stderr=subprocess.DEVNULL)
    print(os.path.join(HERE, "look_inside.png"))


if __name__ == "__main__":
    main()
