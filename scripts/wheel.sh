#!/usr/bin/env bash
# wheel.sh - build the Python package as a platform wheel with the Go core
# inside: dist/ckptkit-<version>-py3-none-<platform>.whl.
#
#   scripts/wheel.sh [-s SUITE]
#
# libckptkit.so is built first (`make python`); the wheel is built offline
# (no build isolation, no index) by setuptools in the torch environment of
# SUITE (scripts/torch-env.sh; default trixie), which has pip and a
# setuptools with bdist_wheel, from a copy of python/ without its tests, so
# the tree gets no build/ or *.egg-info. The wheel needs no Go and no
# PYTHONPATH: `pip install dist/ckptkit-*.whl`.
set -euo pipefail
SUITE=trixie
if [[ ${1:-} == -s ]]; then
	SUITE=${2:?usage: $0 [-s SUITE]}
fi
cd "$(dirname "$0")/.."
make -s python
src=build/wheel-src
rm -rf "$src"
mkdir -p "$src" dist
trap 'rm -rf build/wheel-src' EXIT
cp -R python/pyproject.toml python/setup.py python/ckptkit "$src/"
find "$src" -name __pycache__ -prune -exec rm -rf {} +
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' python/pyproject.toml)
rm -f dist/ckptkit-"$version"-*.whl
bash scripts/torch-env.sh -s "$SUITE" run python3 -m pip wheel --quiet --no-deps --no-build-isolation --no-index -w dist "$src" >&2
whl=$(ls dist/ckptkit-"$version"-py3-none-*.whl)
case $whl in
*-none-any.whl) echo "wheel.sh: $whl is not platform-tagged" >&2; exit 1 ;;
esac
for f in ckptkit/libckptkit.so ckptkit/py.typed; do
	python3 -c 'import sys, zipfile; sys.exit(not any(n.endswith(sys.argv[2]) for n in zipfile.ZipFile(sys.argv[1]).namelist()))' "$whl" "$f" ||
		{ echo "wheel.sh: $whl lacks $f" >&2; exit 1; }
done
echo "$whl"
