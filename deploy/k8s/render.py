#!/usr/bin/env python3
"""Renders a kustomization directory under deploy/k8s/ the way kustomize v2.0.3 (the one built into
Debian's kubectl 1.20) renders it, for the fields deploy/k8s uses and nothing more:

  resources              manifest files of this directory (one or more documents each)
  bases                  directories with a kustomization.yaml, rendered first, in order
  patchesStrategicMerge  patches matched by apiVersion, kind and name; maps merge key by key and a
                         null deletes the key, as a strategic merge does. A list in a patch is refused:
                         its merge keys are kustomize's business, and the overlays need none.
  namespace              set on every namespaced object

Any other field is refused, so an overlay that renders here renders the same under kubectl. Output:
the objects as one YAML stream in kustomize's legacy order (kinds that others need first).

  python3 deploy/k8s/render.py deploy/k8s/autoscale/hpa | kubectl apply -f -
"""
import argparse
import os
import sys

import yaml

FIELDS = {"apiVersion", "kind", "namespace", "resources", "bases", "patchesStrategicMerge"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PersistentVolume", "StorageClass", "PriorityClass", "APIService"}
# kustomize's legacy sort: these kinds first, in this order, then the rest by group, version and
# kind, then these last. Within a kind by name (kustomize v2.0.3 and v5 order names differently).
ORDER_FIRST = ["Namespace", "ResourceQuota", "StorageClass", "CustomResourceDefinition", "ServiceAccount",
               "PodSecurityPolicy", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ConfigMap",
               "Secret", "Endpoints", "Service", "LimitRange", "PriorityClass", "PersistentVolume",
               "PersistentVolumeClaim", "Deployment", "StatefulSet", "CronJob", "PodDisruptionBudget"]
ORDER_LAST = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]


class RenderError(Exception):
    pass


def key(obj):
    """An object's identity: its API group (not version), kind and name, as kustomize matches patches."""
    group = obj.get("apiVersion", "").rpartition("/")[0]
    return (group, obj.get("kind"), (obj.get("metadata") or {}).get("name"))


def load_documents(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    for d in docs:
        if not isinstance(d, dict) or "kind" not in d or "metadata" not in d:
            raise RenderError(f"{path}: a document without kind and metadata")
    return docs


def merge(target, patch, where):
    """A strategic merge of maps: keys merge recursively, a null deletes; lists are refused."""
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, dict) and isinstance(target.get(k), dict):
            merge(target[k], v, f"{where}.{k}")
        elif isinstance(v, list):
            raise RenderError(f"{where}.{k}: a list in a patch (render.py merges maps only)")
        else:
            target[k] = v


def render(directory):
    """The objects of one kustomization directory, patched and namespaced, in input order."""
    path = os.path.join(directory, "kustomization.yaml")
    if not os.path.isfile(path):
        raise RenderError(f"{directory}: no kustomization.yaml")
    with open(path) as f:
        spec = yaml.safe_load(f) or {}
    unknown = set(spec) - FIELDS
    if unknown:
        raise RenderError(f"{path}: {', '.join(sorted(unknown))}: not a field render.py renders "
                          f"(kustomize v2.0.3's subset: {', '.join(sorted(FIELDS))})")
    objects = []
    for base in spec.get("bases", []):
        objects += render(os.path.normpath(os.path.join(directory, base)))
    for resource in spec.get("resources", []):
        full = os.path.join(directory, resource)
        if not os.path.isfile(full):
            raise RenderError(f"{path}: resource {resource} is not a file (kustomize v2.0.3 takes directories under bases)")
        objects += load_documents(full)
    seen = {}
    for obj in objects:
        if key(obj) in seen:
            raise RenderError(f"{path}: {key(obj)[1]} {key(obj)[2]} appears twice")
        seen[key(obj)] = obj
    for patch_file in spec.get("patchesStrategicMerge", []):
        for patch in load_documents(os.path.join(directory, patch_file)):
            target = seen.get(key(patch))
            if target is None:
                raise RenderError(f"{patch_file}: no {key(patch)[1]} {key(patch)[2]} to patch")
            merge(target, {k: v for k, v in patch.items() if k not in ("apiVersion", "kind")}, patch_file)
    if "namespace" in spec:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = spec["namespace"]
    return objects


def legacy_order(objects):
    def rank(obj):
        kind = obj["kind"]
        if kind in ORDER_FIRST:
            return (0, ORDER_FIRST.index(kind), "", obj["metadata"]["name"])
        if kind in ORDER_LAST:
            return (2, ORDER_LAST.index(kind), "", obj["metadata"]["name"])
        group, _, version = obj["apiVersion"].rpartition("/")
        return (1, 0, f"{group}_{version}_{kind}", obj["metadata"]["name"])
    return sorted(objects, key=rank)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", help="a directory holding a kustomization.yaml")
    args = parser.parse_args()
    try:
        objects = legacy_order(render(args.directory))
    except (RenderError, OSError, yaml.YAMLError) as e:
        print(f"render.py: error: {e}", file=sys.stderr)
        return 1
    yaml.safe_dump_all(objects, sys.stdout, default_flow_style=False, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
