"""What both multi-fidelity reference scripts share: the bench's protocol (rungs, simulated
workers) and the Rust bench's problems trained in their own process (`multi_fidelity
--oracle PROBLEM`), so that every reference trains exactly as the Rust runs do."""
import json
import subprocess

MAX_EPOCHS = 27
RUNGS = [1, 3, 9, 27]
WORKERS = 4


class Oracle:
    """The Rust bench's problem, trained in its own process (see its --oracle)."""

    def __init__(self, binary, problem):
        self.proc = subprocess.Popen([binary, "--oracle", problem], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.next_id = 0

    def new_trial(self):
        self.next_id += 1
        return self.next_id

    def train(self, trial, parameters, to):
        self.proc.stdin.write(json.dumps({"trial": trial, "parameters": parameters, "to": to}) + "\n")
        answer = json.loads(self.proc.stdout.readline())
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer["losses"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()
