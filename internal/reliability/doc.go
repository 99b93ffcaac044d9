// Package reliability is the in-tree reliability campaign of issue 16: it
// attacks ckptkit from the outside as a demanding user would (SIGKILL at
// random points of saves, two writers on one run, bit flips anywhere in a
// checkpoint, connections broken under saves and loads, hostile inputs,
// killed uploads) and counts, per class, what was tried, what survived and
// what was lost. Its tests hold the figures to the bars of the issue.
//
// The package has no code of its own beyond its tests. `make reliability`
// (scripts/reliability.sh) runs it at full size (CKPTKIT_RELIABILITY=full)
// with the S3/GCS test servers and prints the table docs/RELIABILITY.md
// publishes; `make test` runs a bounded subset.
package reliability
