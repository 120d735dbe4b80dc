/* Reading and writing NumPy .npy files (format versions 1.0-3.0, little-endian, C order) for
 * kiln-run. */
#ifndef KILN_CLI_NPY_H
#define KILN_CLI_NPY_H

#include <stdio.h>

#include "kiln/kiln.h"

/* A new contiguous tensor with the file's dtype and shape; KILN_ERR_VALUE with a message naming
 * the file and what is wrong (unsupported dtype, Fortran order, a truncated file, ...). */
kiln_status npy_read(const char *path, kiln_tensor **out, char *err, size_t err_size);
/* Writes t (contiguous) as a version 1.0 file to f, opened for writing, and closes f (path: the
 * file's name in messages). */
kiln_status npy_write(FILE *f, const char *path, const kiln_tensor *t, char *err, size_t err_size);

#endif
