#!/bin/sh
# Part of derived.Containerfile's build context.
echo "hello from a derived image on $(hostname)"
