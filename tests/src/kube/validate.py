# Validates every document of a rendered YAML file, offline, for the
# Kubernetes versions named on the command line: built-in kinds with
# kubernetes-validate (strict: unknown fields are errors), CRD kinds against
# the vendored CRD schemas in fixtures/crds (made strict the same way). A kind
# with neither schema is an error, not a warning.
#   python3 validate.py <crds dir> <file> <version>...
import json
import os
import sys

import yaml
import jsonschema
from kubernetes_validate import utils


def strict(schema):
    """Unknown properties refused wherever the schema lists properties and
    does not keep unknown fields (as kubernetes-validate's strict schemas)."""
    if isinstance(schema, dict):
        for value in schema.values():
            strict(value)
        if ("properties" in schema and "additionalProperties" not in schema
                and not schema.get("x-kubernetes-preserve-unknown-fields")):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        for value in schema:
            strict(value)
    return schema


def crd_schema(crds, document):
    group, _, version = document["apiVersion"].rpartition("/")
    path = os.path.join(crds, f"{group}_{version}_{document['kind'].lower()}.json")
    if not group or not os.path.exists(path):
        return None
    with open(path) as f:
        return strict(json.load(f)["schema"])


def main():
    crds, filename, versions = sys.argv[1], sys.argv[2], sys.argv[3:]
    with open(filename) as f:
        documents = [d for d in yaml.safe_load_all(f) if d]
    failures = []
    for document in documents:
        name = f"{document.get('kind')}/{document.get('metadata', {}).get('name')}"
        schema = crd_schema(crds, document)
        if schema is not None:
            validator = jsonschema.Draft7Validator(schema)
            for error in validator.iter_errors(document):
                path = ".".join(str(p) for p in error.absolute_path)
                failures.append(f"{name} (CRD schema): {path}: {error.message}")
            continue
        for version in versions:
            try:
                utils.validate(document, version, strict=True)
            except utils.ValidationError as error:
                path = ".".join(str(p) for p in error.absolute_path)
                failures.append(f"{name} ({version}): {path}: {error.message}")
            except utils.SchemaNotFoundError:
                failures.append(f"{name} ({version}): no schema for {document['apiVersion']}")
    for failure in failures:
        print(failure)
    sys.exit(1 if failures else 0)


main()
