/*
 * mpi_allreduce: the OpenMPI peer of `cargo xtask bench --part loopback`.
 *
 * MPI_Allreduce (float32, sum, out of place) over a size sweep, nccl-tests style:
 *   mpirun -np 4 mpi_allreduce -b MIN -e MAX -f FACTOR -n ITERS -w WARMUP
 * Sizes are bytes with an optional K/M/G suffix (powers of 1024). For every size, rank 0 prints
 *   R2B peer=mpi size=<bytes> count=<elems> iters=<n> time_us=<avg> algbw=<GB/s> busbw=<GB/s> wrong=<n>
 * time is the slowest rank's average over ITERS back-to-back calls after WARMUP calls and a
 * barrier; busbw = algbw * 2(n-1)/n (nccl-tests). Inputs are small integers, so the sum is
 * exact in any order and every element of the result is checked (wrong = elements that differ,
 * summed over ranks). Exit status 1 if any element was wrong, 2 on bad arguments.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long long parse_size(const char *s) {
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    if (end == s || v < 0) return -1;
    if (*end == 'K' || *end == 'k') v <<= 10;
    else if (*end == 'M' || *end == 'm') v <<= 20;
    else if (*end == 'G' || *end == 'g') v <<= 30;
    else if (*end != '\0') return -1;
    return v;
}

/* Element i of rank r's input: a small integer, so sums are exact. */
static float input_value(long long i, int rank) { return (float)((i * 7 + (long long)rank * 13) % 17); }

int main(int argc, char **argv) {
    long long min_b = 4, max_b = 64LL << 20, factor = 2;
    int iters = 20, warmup = 5;
    MPI_Init(&argc, &argv);
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    for (int a = 1; a < argc; a++) {
        const char *v = a + 1 < argc ? argv[a + 1] : NULL;
        if (v == NULL) goto usage;
        if (!strcmp(argv[a], "-b")) min_b = parse_size(v);
        else if (!strcmp(argv[a], "-e")) max_b = parse_size(v);
        else if (!strcmp(argv[a], "-f")) factor = atoll(v);
        else if (!strcmp(argv[a], "-n")) iters = atoi(v);
        else if (!strcmp(argv[a], "-w")) warmup = atoi(v);
        else goto usage;
        a++;
    }
    if (min_b < 4 || max_b < min_b || factor < 2 || iters < 1 || warmup < 0) goto usage;

    long long max_count = max_b / 4;
    float *send = malloc((size_t)max_count * sizeof(float));
    float *recv = malloc((size_t)max_count * sizeof(float));
    if (send == NULL || recv == NULL) {
        fprintf(stderr, "mpi_allreduce: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    for (long long i = 0; i < max_count; i++) send[i] = input_value(i, rank);
    long long total_wrong = 0;
    for (long long bytes = min_b; bytes <= max_b; bytes *= factor) {
        int count = (int)(bytes / 4);
        for (int w = 0; w < warmup; w++) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        memset(recv, 0, (size_t)count * sizeof(float));
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int it = 0; it < iters; it++) MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double mine = (MPI_Wtime() - t0) / iters, slowest = 0;
        MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        long long wrong = 0, wrong_all = 0;
        for (long long i = 0; i < count; i++) {
            float want = 0;
            for (int r = 0; r < world; r++) want += input_value(i, r);
            if (recv[i] != want) wrong++;
        }
        MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            double algbw = (double)count * 4 / slowest / 1e9;
            printf("R2B peer=mpi size=%lld count=%d iters=%d time_us=%.3f algbw=%.6f busbw=%.6f wrong=%lld\n",
                   (long long)count * 4, count, iters, slowest * 1e6, algbw,
                   algbw * 2.0 * (world - 1) / world, wrong_all);
            fflush(stdout);
        }
        total_wrong += wrong_all;
        if (bytes > max_b / factor) break;
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return rank == 0 && total_wrong != 0 ? 1 : 0;

usage:
    if (rank == 0)
        fprintf(stderr, "usage: mpirun -np N mpi_allreduce [-b MIN] [-e MAX] [-f FACTOR>=2] [-n ITERS>=1] [-w WARMUP]\n");
    MPI_Finalize();
    return 2;
}
