/* tandem from C: a 1 Mi-float all-reduce, checked. Build against an installed tandem:
 *   cc -std=c99 examples/allreduce.c $(pkg-config --cflags --libs tandem) -o allreduce
 *   tandem launch -n 2 -- ./allreduce */
#include <stdio.h>
#include <stdlib.h>
#include <tandem/c_api.h>

int main(void) {
  enum { COUNT = 1 << 20 };
  tandem_comm_t* comm = NULL;
  int rank = 0, size = 0, wrong = 0, i;
  float* x = malloc(sizeof(float) * COUNT);
  if (tandem_comm_create_from_env(&comm) != TANDEM_OK) {
    fprintf(stderr, "consumer_c: %s\n", tandem_last_error());
    return 1;
  }
  tandem_comm_rank(comm, &rank);
  tandem_comm_size(comm, &size);
  for (i = 0; i < COUNT; ++i) x[i] = (float)(rank + 1);
  if (tandem_allreduce(comm, x, x, COUNT, TANDEM_F32, TANDEM_SUM, -1) != TANDEM_OK) {
    fprintf(stderr, "consumer_c: %s\n", tandem_last_error());
    return 1;
  }
  for (i = 0; i < COUNT; ++i) wrong += x[i] != (float)(size * (size + 1) / 2);
  printf("consumer_c: rank %d of %d: tandem %s, sum %g, wrong %d\n", rank, size, tandem_version_string(), x[0], wrong);
  tandem_comm_destroy(comm);
  free(x);
  return wrong != 0;
}
