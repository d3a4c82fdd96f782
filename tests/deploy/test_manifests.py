"""Every Kubernetes manifest in deploy/k8s/ validates offline against the schemas of the built-in
kinds (kubernetes-validate, strict: an unknown field is an error), as a cluster's API server would
take it. A manifest with a misspelled field is refused, so the check itself is known to bite."""
import glob
import os
import subprocess
import sys
import tempfile
import unittest

SOURCE = os.environ.get("SPECULA_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "../..")))
K8S = os.path.join(SOURCE, "deploy", "k8s")
VERSION = "1.28.0"  # the oldest release whose native grpc probe is GA (1.27) and kept


def validate(paths):
    return subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "-k", VERSION, *paths],
                          capture_output=True, text=True, timeout=120)


class ManifestsTest(unittest.TestCase):
    def test_every_manifest_validates(self):
        paths = sorted(glob.glob(os.path.join(K8S, "**", "*.yaml"), recursive=True))
        self.assertGreaterEqual(len(paths), 9, paths)
        r = validate(paths)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for p in paths:
            self.assertIn(f"{p} passed", r.stdout + r.stderr)

    def test_a_misspelled_field_is_refused(self):
        with open(os.path.join(K8S, "serve", "deployment.yaml")) as f:
            text = f.read()
        self.assertIn("terminationGracePeriodSeconds:", text)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as bad:
            bad.write(text.replace("terminationGracePeriodSeconds:", "terminationGracePeriodSecond:"))
            bad.flush()
            r = validate([bad.name])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("terminationGracePeriodSecond", r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main()
