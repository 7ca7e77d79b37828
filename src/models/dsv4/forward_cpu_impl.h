/* forward_cpu_impl.h -- helpers shared by the forward_cpu*.c files only. */
#ifndef DS4_FORWARD_CPU_IMPL_H
#define DS4_FORWARD_CPU_IMPL_H

#include <stdbool.h>
#include <stdlib.h>

/* Round every value to IEEE half and back (ds4's F16 row storage). */
void ds4_fwd_f16_round(float *x, int n);

#endif
