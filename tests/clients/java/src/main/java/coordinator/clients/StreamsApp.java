package coordinator.clients;

import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueStore;

/**
 * A stateful Kafka Streams app under exactly_once_v2: a running total per group, kept in a state
 * store with its changelog, after a repartition step.
 *
 * <p>Each input value is "id:amount:group" (its key is not used). The app re-keys each record by
 * its group (the "by-group" repartition topic), adds its amount to the group's total in the
 * "totals" store (the "totals" changelog topic) and writes, for every input, the group's new total
 * as "id:total" to the output topic. A reader of the output can so check that every input was
 * counted once, and that each group's totals are the running sums of its inputs in the order they
 * were counted.
 *
 * <p>Usage: StreamsApp BOOTSTRAP APPLICATION_ID STATE_DIR INPUT OUTPUT DELAY_MS [NAME=VALUE...], the
 * settings after the first six added to (or replacing) the app's Streams configs. The app runs until
 * it is killed; SIGTERM closes it cleanly and prints how the close ended. Each record sleeps DELAY_MS as it is counted, so that a test can
 * kill it in the middle of its work. It prints its state changes and each store partition it restored
 * from its changelog (with the number of records), one line of JSON each; an error that kills its
 * stream thread is printed and exits 1.
 */
public final class StreamsApp {
    private StreamsApp() {
    }

    public static void main(String[] args) throws InterruptedException {
        if (args.length < 6) {
            System.err.println("usage: StreamsApp BOOTSTRAP APPLICATION_ID STATE_DIR INPUT OUTPUT DELAY_MS [NAME=VALUE...]");
            System.exit(2);
        }
        String bootstrap = args[0], application = args[1], stateDir = args[2];
        String input = args[3], output = args[4];
        long delayMs = Long.parseLong(args[5]);

        Properties config = new Properties();
        config.put(StreamsConfig.APPLICATION_ID_CONFIG, application);
        config.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        config.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        config.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        config.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        // Every update of a total goes out (no record cache folding them together).
        config.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        config.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        // Small polls, so that a commit comes between them: Streams commits once the records of a
        // poll are processed, and a slow app would otherwise put all its work in one transaction.
        config.put(StreamsConfig.consumerPrefix(ConsumerConfig.MAX_POLL_RECORDS_CONFIG), 10);
        // The repartition topic's records, once consumed, are deleted (DeleteRecords) every
        // second rather than Streams' 30 s.
        config.put(StreamsConfig.REPARTITION_PURGE_INTERVAL_MS_CONFIG, 1000);
        // A killed instance's member leaves its group, and its open transaction is aborted,
        // within seconds rather than Kafka's 45 s and Streams' 10 s defaults.
        config.put(StreamsConfig.consumerPrefix(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG), 3000);
        config.put(StreamsConfig.consumerPrefix(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG), 500);
        config.put(StreamsConfig.producerPrefix(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG), 5000);

        for (int i = 6; i < args.length; i++) {
            String[] setting = args[i].split("=", 2);
            config.put(setting[0], setting[1]);
        }

        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
            .groupBy((key, value) -> value.split(":")[2], Grouped.with("by-group", Serdes.String(), Serdes.String()))
            .aggregate(
                () -> "-:0",
                (group, value, total) -> {
                    pause(delayMs);
                    String[] fields = value.split(":");
                    long sum = Long.parseLong(total.split(":")[1]) + Long.parseLong(fields[1]);
                    return fields[0] + ":" + sum;
                },
                Materialized.<String, String, KeyValueStore<Bytes, byte[]>>as("totals")
                    .withKeySerde(Serdes.String())
                    .withValueSerde(Serdes.String()))
            .toStream()
            .to(output, Produced.with(Serdes.String(), Serdes.String()));

        KafkaStreams streams = new KafkaStreams(builder.build(), config);
        CountDownLatch closed = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            System.out.println("{\"state\": \"" + now + "\"}");
            System.out.flush();
        });
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            @Override
            public void onRestoreStart(TopicPartition partition, String store, long start, long end) {
            }

            @Override
            public void onBatchRestored(TopicPartition partition, String store, long end, long restored) {
            }

            @Override
            public void onRestoreEnd(TopicPartition partition, String store, long restored) {
                System.out.println("{\"restored\": " + restored + ", \"from\": " + Json.quote(partition.toString()) + "}");
                System.out.flush();
            }
        });
        streams.setUncaughtExceptionHandler(error -> {
            System.out.println("{\"error\": " + Json.quote(String.valueOf(error)) + "}");
            System.out.flush();
            Runtime.getRuntime().halt(1);
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        // The hook prints how close() ended: the state listener's own NOT_RUNNING line is printed
        // by Streams' close thread after close() has returned, so the JVM may halt before it.
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            boolean done = streams.close(Duration.ofSeconds(30));
            System.out.println("{\"closed\": " + done + ", \"state\": \"" + streams.state() + "\"}");
            System.out.flush();
            closed.countDown();
        }));
        streams.start();
        closed.await();
    }

    private static void pause(long ms) {
        if (ms <= 0) {
            return;
        }
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
