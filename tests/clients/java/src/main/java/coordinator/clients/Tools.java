package coordinator.clients;

import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.Map;

import org.apache.kafka.common.utils.internals.Exit;

/**
 * Kafka's command-line tools, unchanged, in one JVM: each line of standard input is a command,
 * its words separated by tabs, the first one the tool's name (kafka-topics, kafka-configs,
 * kafka-consumer-groups, kafka-share-groups, kafka-transactions, kafka-producer-perf-test and the others MAIN_CLASSES names).
 * Each runs as its script
 * would run it (the tool's main class) with Kafka's Exit kept from ending the JVM: a zero exit
 * is noted and the tool goes on (the tools exit 0 last, in a finally), another code ends the
 * tool by an exception. Each prints one line of JSON:
 * {"command": N, "code": EXIT, "out": TEXT, "err": TEXT}.
 */
public final class Tools {
    private static final Map<String, String> MAIN_CLASSES = Map.ofEntries(
        Map.entry("kafka-topics", "org.apache.kafka.tools.TopicCommand"),
        Map.entry("kafka-configs", "org.apache.kafka.tools.ConfigCommand"),
        Map.entry("kafka-consumer-groups", "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"),
        Map.entry("kafka-share-groups", "org.apache.kafka.tools.consumer.group.ShareGroupCommand"),
        Map.entry("kafka-streams-groups", "org.apache.kafka.tools.streams.StreamsGroupCommand"),
        Map.entry("kafka-transactions", "org.apache.kafka.tools.TransactionsCommand"),
        Map.entry("kafka-producer-perf-test", "org.apache.kafka.tools.ProducerPerformance"),
        Map.entry("kafka-client-metrics", "org.apache.kafka.tools.ClientMetricsCommand"),
        Map.entry("kafka-delegation-tokens", "org.apache.kafka.tools.DelegationTokenCommand"),
        Map.entry("kafka-log-dirs", "org.apache.kafka.tools.LogDirsCommand"),
        Map.entry("kafka-get-offsets", "org.apache.kafka.tools.GetOffsetShell"),
        Map.entry("kafka-delete-records", "org.apache.kafka.tools.DeleteRecordsCommand"),
        Map.entry("kafka-leader-election", "org.apache.kafka.tools.LeaderElectionCommand"),
        Map.entry("kafka-features", "org.apache.kafka.tools.FeatureCommand"),
        Map.entry("kafka-cluster", "org.apache.kafka.tools.ClusterTool"),
        Map.entry("kafka-acls", "org.apache.kafka.tools.AclCommand"));

    private static final class Exited extends RuntimeException {
        final int code;

        Exited(int code) {
            super("exit " + code);
            this.code = code;
        }
    }

    private static void exit(int code, String message) {
        if (code != 0) {
            throw new Exited(code);
        }
    }

    public static void main(String[] args) throws Exception {
        PrintStream report = System.out;
        Exit.setExitProcedure(Tools::exit);
        Exit.setHaltProcedure(Tools::exit);
        BufferedReader commands = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        int n = 0;
        while ((line = commands.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            String[] words = line.split("\t");
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            ByteArrayOutputStream err = new ByteArrayOutputStream();
            PrintStream savedOut = System.out;
            PrintStream savedErr = System.err;
            int code = 0;
            System.setOut(new PrintStream(out, true, StandardCharsets.UTF_8));
            System.setErr(new PrintStream(err, true, StandardCharsets.UTF_8));
            try {
                String main = MAIN_CLASSES.get(words[0]);
                if (main == null) {
                    throw new IllegalArgumentException("no such tool: " + words[0]);
                }
                String[] rest = java.util.Arrays.copyOfRange(words, 1, words.length);
                Method method = Class.forName(main).getMethod("main", String[].class);
                method.invoke(null, (Object) rest);
            } catch (InvocationTargetException e) {
                Throwable cause = e.getCause();
                if (cause instanceof Exited exited) {
                    code = exited.code;
                } else {
                    code = -1;
                    cause.printStackTrace();
                }
            } catch (Exited exited) {
                code = exited.code;
            } catch (Exception e) {
                code = -1;
                e.printStackTrace();
            } finally {
                System.out.flush();
                System.err.flush();
                System.setOut(savedOut);
                System.setErr(savedErr);
            }
            report.println("{\"command\": " + n + ", \"code\": " + code + ", \"out\": "
                + Json.quote(out.toString(StandardCharsets.UTF_8)) + ", \"err\": " + Json.quote(err.toString(StandardCharsets.UTF_8)) + "}");
            report.flush();
            n++;
        }
        System.exit(0);
    }
}
