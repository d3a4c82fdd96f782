"""Every Kubernetes manifest in deploy/k8s/ validates offline, as a cluster's API server would take it:
built-in kinds against Kubernetes' schemas (kubernetes-validate, strict: an unknown field is an error),
the CRD kinds (ServiceMonitor, ScaledObject) and the kustomization files against the repository's JSON
schemas (check-jsonschema, deploy/k8s/schemas/). Both overlays (autoscale/hpa, autoscale/keda) are
rendered by deploy/k8s/render.py and validated the same way, and neither autoscales one Deployment
twice. A misspelled field is refused by each validator, so each check is known to bite."""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

SOURCE = os.environ.get("SPECULA_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "../..")))
K8S = os.path.join(SOURCE, "deploy", "k8s")
SCHEMAS = os.path.join(K8S, "schemas")
VERSION = "1.28.0"  # the oldest release whose native grpc probe is GA (1.27) and kept
CRD_SCHEMAS = {"ServiceMonitor": "servicemonitor.json", "ScaledObject": "scaledobject.json"}
OVERLAYS = ["autoscale/hpa", "autoscale/keda"]
AUTOSCALERS = ("HorizontalPodAutoscaler", "ScaledObject")

sys.path.insert(0, K8S)
import render  # noqa: E402  (deploy/k8s/render.py)


def validate(paths):
    return subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "-k", VERSION, *paths],
                          capture_output=True, text=True, timeout=120)


def check_schema(schema, paths):
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--schemafile", os.path.join(SCHEMAS, schema),
                           *paths], capture_output=True, text=True, timeout=120)


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def kustomizations():
    return sorted(glob.glob(os.path.join(K8S, "**", "kustomization.yaml"), recursive=True))


def patch_files():
    """The strategic-merge patches the overlays name: partial objects, validated once rendered."""
    patches = set()
    for k in kustomizations():
        for p in load(k)[0].get("patchesStrategicMerge", []):
            patches.add(os.path.normpath(os.path.join(os.path.dirname(k), p)))
    return patches


def manifests():
    """Every YAML file under deploy/k8s/, by the validator it goes to."""
    groups = {"builtin": [], "kustomization": [], "patch": [], **{kind: [] for kind in CRD_SCHEMAS}}
    patches = patch_files()
    for path in sorted(glob.glob(os.path.join(K8S, "**", "*.yaml"), recursive=True)):
        if os.path.basename(path) == "kustomization.yaml":
            groups["kustomization"].append(path)
        elif path in patches:
            groups["patch"].append(path)
        else:
            kinds = {d["kind"] for d in load(path)}
            crd = kinds & set(CRD_SCHEMAS)
            assert not crd or len(kinds) == 1, f"{path}: a CRD kind mixed with others: {kinds}"
            groups[crd.pop() if crd else "builtin"].append(path)
    return groups


def write_objects(objects, directory):
    """One file per object (check-jsonschema reads one document per file), grouped by validator."""
    groups = {"builtin": [], **{kind: [] for kind in CRD_SCHEMAS}}
    for i, obj in enumerate(objects):
        path = os.path.join(directory, f"{i:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(obj, f)
        groups[obj["kind"] if obj["kind"] in CRD_SCHEMAS else "builtin"].append(path)
    return groups


def doubly_scaled(objects):
    """Workloads that more than one autoscaler targets (KEDA makes an HPA of its own per ScaledObject)."""
    targets = {}
    for obj in objects:
        if obj["kind"] in AUTOSCALERS:
            ref = obj["spec"]["scaleTargetRef"]
            target = (obj["metadata"].get("namespace"), ref.get("kind", "Deployment"), ref["name"])
            targets.setdefault(target, []).append(f"{obj['kind']}/{obj['metadata']['name']}")
    return {t: by for t, by in targets.items() if len(by) > 1}


def with_typo(path, field, typo):
    """The file's text with one field misspelled, in a temporary file the caller removes."""
    with open(path) as f:
        text = f.read()
    assert f"{field}:" in text, (path, field)
    tmp = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    tmp.write(text.replace(f"{field}:", f"{typo}:", 1))
    tmp.close()
    return tmp.name


class ManifestsTest(unittest.TestCase):
    def test_every_manifest_validates(self):
        groups = manifests()
        self.assertGreaterEqual(len(groups["builtin"]), 18, groups["builtin"])
        r = validate(groups["builtin"])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for p in groups["builtin"]:
            self.assertIn(f"{p} passed", r.stdout + r.stderr)
        for kind, schema in CRD_SCHEMAS.items():
            self.assertTrue(groups[kind], f"no {kind} manifest")
            r = check_schema(schema, groups[kind])
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertGreaterEqual(len(groups["kustomization"]), 7, groups["kustomization"])
        r = check_schema("kustomization.json", groups["kustomization"])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(len(groups["patch"]), 2, groups["patch"])  # checked rendered, below

    def test_a_misspelled_field_is_refused(self):
        bad = with_typo(os.path.join(K8S, "serve", "deployment.yaml"), "terminationGracePeriodSeconds",
                        "terminationGracePeriodSecond")
        try:
            r = validate([bad])
        finally:
            os.unlink(bad)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("terminationGracePeriodSecond", r.stdout + r.stderr)

    def test_the_schemas_refuse_a_misspelled_or_missing_field(self):
        cases = [
            ("servicemonitor.json", "monitoring/servicemonitor.yaml", "scrapeTimeout", "scrapeTimout"),
            ("servicemonitor.json", "monitoring/servicemonitor.yaml", "endpoints", "endpoint"),
            ("scaledobject.json", "autoscale/keda/scaledobject.yaml", "minReplicaCount", "minReplicaCont"),
            ("scaledobject.json", "autoscale/keda/scaledobject.yaml", "threshold", "treshold"),
            ("kustomization.json", "autoscale/hpa/kustomization.yaml", "patchesStrategicMerge", "patches"),
        ]
        for schema, manifest, field, typo in cases:
            with self.subTest(manifest=manifest, typo=typo):
                bad = with_typo(os.path.join(K8S, manifest), field, typo)
                try:
                    r = check_schema(schema, [bad])
                finally:
                    os.unlink(bad)
                self.assertNotEqual(r.returncode, 0, r.stdout)
                self.assertIn(f"'{typo}' was unexpected", r.stdout + r.stderr)

    def test_the_schemas_name_their_sources(self):
        for name in sorted(os.listdir(SCHEMAS)):
            with self.subTest(schema=name), open(os.path.join(SCHEMAS, name)) as f:
                text = f.read()
            self.assertRegex(text, r'"\$comment": "Written from [^"]*https://')

    def test_the_overlays_render_and_validate(self):
        for overlay in OVERLAYS:
            with self.subTest(overlay=overlay), tempfile.TemporaryDirectory() as tmp:
                objects = render.legacy_order(render.render(os.path.join(K8S, overlay)))
                kinds = [o["kind"] for o in objects]
                self.assertEqual(sum(k in AUTOSCALERS for k in kinds), 1, kinds)
                self.assertEqual({o["metadata"].get("namespace") for o in objects}, {"specula"})
                stable = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "specula")
                self.assertNotIn("replicas", stable["spec"])  # the autoscaler owns it
                groups = write_objects(objects, tmp)
                r = validate(groups["builtin"])
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                for kind, schema in CRD_SCHEMAS.items():
                    if groups[kind]:
                        r = check_schema(schema, groups[kind])
                        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_no_overlay_autoscales_a_deployment_twice(self):
        everything = []
        for overlay in OVERLAYS:
            objects = render.render(os.path.join(K8S, overlay))
            self.assertEqual(doubly_scaled(objects), {}, overlay)
            everything += [o for o in objects if o["kind"] in AUTOSCALERS]
        # Both overlays applied together would scale the stable Deployment twice: the check sees it.
        self.assertEqual(list(doubly_scaled(everything).values()),
                         [["HorizontalPodAutoscaler/specula", "ScaledObject/specula"]])

    def test_kubectl_kustomize_renders_the_same(self):
        # $SPECULA_KUBECTL picks one (Debian's kubectl 1.20, whose kustomize is v2.0.3, for example).
        kubectl = os.environ.get("SPECULA_KUBECTL") or shutil.which("kubectl")
        if kubectl is None:
            self.skipTest("kubectl is not installed: render.py's output was not compared with kustomize's "
                          "(the other tests validate it)")
        for overlay in OVERLAYS:
            with self.subTest(overlay=overlay, kubectl=kubectl):
                r = subprocess.run([kubectl, "kustomize", os.path.join(K8S, overlay)],
                                   capture_output=True, text=True, timeout=60)
                self.assertEqual(r.returncode, 0, r.stderr)
                theirs = [d for d in yaml.safe_load_all(r.stdout) if d is not None]
                mine = render.legacy_order(render.render(os.path.join(K8S, overlay)))
                # The same objects, kinds in the same order (within a kind, kustomize's versions differ).
                self.assertEqual([o["kind"] for o in mine], [o["kind"] for o in theirs])
                self.assertEqual({render.key(o): o for o in mine}, {render.key(o): o for o in theirs})

    def test_render_refuses_what_it_does_not_render(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "kustomization.yaml"), "w") as f:
                yaml.safe_dump({"resources": ["../../serve"], "patches": []}, f)
            with self.assertRaisesRegex(render.RenderError, "patches: not a field"):
                render.render(tmp)
            with open(os.path.join(tmp, "kustomization.yaml"), "w") as f:
                yaml.safe_dump({"bases": [os.path.join(K8S, "serve")], "patchesStrategicMerge": ["p.yaml"]}, f)
            with open(os.path.join(tmp, "p.yaml"), "w") as f:
                yaml.safe_dump({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "specula"},
                                "spec": {"template": {"spec": {"containers": [{"name": "serve"}]}}}}, f)
            with self.assertRaisesRegex(render.RenderError, "a list in a patch"):
                render.render(tmp)

    def test_the_canary_differs_from_the_stable_replicas_only_where_intended(self):
        stable = load(os.path.join(K8S, "serve", "deployment.yaml"))[0]
        canary = load(os.path.join(K8S, "canary", "deployment.yaml"))[0]
        self.assertEqual(canary["metadata"]["name"], "specula-canary")
        self.assertEqual(canary["spec"]["replicas"], 1)
        env_from = canary["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        self.assertEqual(env_from[0]["configMapRef"]["name"], "specula-serve-canary")
        # Back to the stable one: name, component label, replicas and ConfigMap.
        canary["metadata"]["name"] = "specula"
        canary["spec"]["replicas"] = stable["spec"]["replicas"]
        env_from[0]["configMapRef"]["name"] = "specula-serve"
        text = yaml.safe_dump(canary).replace("component: serve-canary", "component: serve")
        self.assertEqual(yaml.safe_load(text), stable)
        # Same keys in both ConfigMaps; the canary's own weights, version and the stable model name.
        stable_cm = load(os.path.join(K8S, "serve", "configmap.yaml"))[0]["data"]
        canary_cm = load(os.path.join(K8S, "canary", "configmap.yaml"))[0]["data"]
        self.assertEqual(set(stable_cm), set(canary_cm))
        self.assertNotEqual(stable_cm["SPECULA_MODEL"], canary_cm["SPECULA_MODEL"])
        self.assertNotEqual(stable_cm["SPECULA_MODEL_VERSION"], canary_cm["SPECULA_MODEL_VERSION"])
        self.assertEqual(stable_cm["SPECULA_SERVED_MODEL_NAME"], canary_cm["SPECULA_SERVED_MODEL_NAME"])

    def test_both_autoscalers_scale_on_the_waiting_requests_alike(self):
        hpa = load(os.path.join(K8S, "autoscale", "hpa", "hpa.yaml"))[0]["spec"]
        keda = load(os.path.join(K8S, "autoscale", "keda", "scaledobject.yaml"))[0]["spec"]
        adapter = load(os.path.join(K8S, "autoscale", "prometheus-adapter", "configmap.yaml"))[0]
        rule = yaml.safe_load(adapter["data"]["config.yaml"])["rules"][0]
        # The adapter's rule turns the server's series into the metric the HPA asks for, per pod.
        self.assertTrue(rule["seriesQuery"].startswith("specula:num_requests_waiting{"))
        self.assertEqual(rule["resources"]["overrides"]["pod"], {"resource": "pod"})
        served = re.sub(rule["name"]["matches"], rule["name"]["as"].replace("${", "\\g<").replace("}", ">"),
                        "specula:num_requests_waiting")
        metric = hpa["metrics"][0]["pods"]
        self.assertEqual(served, metric["metric"]["name"])
        self.assertEqual(metric["target"]["type"], "AverageValue")
        # KEDA: the same series, threshold and bounds.
        trigger = keda["triggers"][0]
        self.assertIn("specula:num_requests_waiting{", trigger["metadata"]["query"])
        self.assertEqual(trigger["metadata"]["threshold"], metric["target"]["averageValue"])
        self.assertEqual((keda["minReplicaCount"], keda["maxReplicaCount"]), (hpa["minReplicas"], hpa["maxReplicas"]))
        self.assertEqual(keda["advanced"]["horizontalPodAutoscalerConfig"]["behavior"], hpa["behavior"])


if __name__ == "__main__":
    unittest.main()
