"""What the package's check scripts share: checks counted and reported per rank
under the script's name; a failed check ends the rank with status 1."""
import sys


class Checks:
    def __init__(self, name):
        self.name, self.rank, self.count = name, "?", 0

    def check(self, cond, what):
        self.count += 1
        if not cond:
            print(f"{self.name}: rank {self.rank}: failed: {what}", flush=True)
            sys.exit(1)

    def raises(self, cls, text, fn):
        """fn() raises cls with `text` in its message."""
        try:
            fn()
        except cls as e:
            self.check(text in str(e), f"{cls.__name__} message {str(e)!r} lacks {text!r}")
            return
        self.check(False, f"expected {cls.__name__} ({text})")

    def passed(self):
        print(f"{self.name}: rank {self.rank}: {self.count} checks passed", flush=True)
