"""
What the commands (train.py, generate.py, dev/export.py, dev/dashboard.py) share: an argument
parser whose errors are one line, `PROG: error: MESSAGE (see --help)`, exit status 2.
"""
import argparse
import sys

__all__ = ["Parser"]


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage + error
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)
