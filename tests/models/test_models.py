#!/usr/bin/env python3
"""The models the repository carries (models/README.md): every file matches its checksum in
SHA256SUMS and in the README's table, nothing in the folder goes unlisted, and make_draft.py makes
the committed draft again byte for byte, with the header the README gives."""
import hashlib
import os
import re
import struct
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODELS = os.path.join(ROOT, "models")
TINY = os.path.join(MODELS, "tinystories")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def sums():
    out = {}
    with open(os.path.join(TINY, "SHA256SUMS")) as f:
        for line in f:
            digest, name = line.split()
            out[name] = digest
    return out


class ModelsTest(unittest.TestCase):
    def test_every_file_matches_sha256sums(self):
        listed = sums()
        self.assertEqual(set(listed), {"stories260K.bin", "stories260K-draft.bin", "tok512.bin"})
        for name, digest in listed.items():
            self.assertEqual(sha256(os.path.join(TINY, name)), digest, name)

    def test_readme_gives_the_same_checksums(self):
        readme = open(os.path.join(MODELS, "README.md")).read()
        rows = dict(re.findall(r"^\| `([^`]+\.bin)` \|.*\| `([0-9a-f]{64})` \|$", readme, re.M))
        self.assertEqual(rows, sums())

    def test_no_weight_file_goes_unlisted(self):
        bins = {n for n in os.listdir(TINY) if n.endswith(".bin")}
        self.assertEqual(bins, set(sums()))

    def test_make_draft_makes_the_committed_draft(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "draft.bin")
            subprocess.run([sys.executable, os.path.join(TINY, "make_draft.py"),
                            os.path.join(TINY, "stories260K.bin"), out], check=True)
            self.assertEqual(sha256(out), sums()["stories260K-draft.bin"])
            with open(out, "rb") as f:
                header = struct.unpack("<7i", f.read(28))
            self.assertEqual(header, (64, 172, 4, 8, 4, 512, 256))

    def test_make_draft_refuses_a_layer_the_target_lacks(self):
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([sys.executable, os.path.join(TINY, "make_draft.py"),
                                os.path.join(TINY, "stories260K.bin"), os.path.join(tmp, "d.bin"),
                                "--layers", "0,5"], capture_output=True, text=True)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("--layers must name layers in [0, 4]", r.stderr)


if __name__ == "__main__":
    unittest.main()
