/* matmul_epilogue: what the fuse_matmul_epilogue pass needs to know about the op. */
#ifndef KILN_MATMUL_EPILOGUE_H
#define KILN_MATMUL_EPILOGUE_H

#include "../core/internal.h"

#define KILN_MATMUL_EPILOGUE_MAX_STEPS 8

/* The step code of an elementwise op an epilogue can apply, or -1. */
int kiln_matmul_epilogue_code(kiln_op op);

/* For tests: on, the kernel runs each step's whole kernel on views of every block (the plain
 * reference path) instead of its inner loop on chunks of rows. Not while kernels run. */
void kiln_matmul_epilogue_set_reference(bool on);

#endif
