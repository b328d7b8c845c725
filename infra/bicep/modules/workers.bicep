// The workers: an event-driven Container Apps Job, scaled from zero by KEDA's azure-queue
// scaler on the task shards (read with the workers' managed identity). Each execution runs
// `bagpipe worker` until the queues have been idle for a while, so reductions may run far
// past a Function's time limit. The image comes from the registry made here (see
// docs/deploy.md: `az acr build`). The scaler counts messages, and a message names up to
// tasksPerMessage attempts: an execution is asked for per slots / tasksPerMessage of them.

param prefix string
param suffix string
param location string
param storageName string
@description('The app settings the code reads (names.json keys → values), shared with the Function App.')
param settings object
@description('App settings that are Key Vault secrets (names.json key value → secret URI), read by the job itself.')
param secretSettings object = {}
param workspaceCustomerId string
@secure()
param workspaceKey string
@description('The worker image; empty: a placeholder until the first `az acr build`.')
param image string
@description('vCPUs of one worker (0.25 steps, at most 4).')
param cpu string
@description('Memory of one worker, e.g. 8Gi (2 GiB per vCPU).')
param memory string
@description('Most worker executions at once.')
param maxReplicas int
@description('Tasks one worker runs at once.')
param slots int
@description('Attempts a task message names (BAGPIPE_TASKS_PER_MESSAGE): the scaler counts messages.')
param tasksPerMessage int
@description('Seconds a worker waits on empty queues before it exits.')
param idleSeconds int
@description('Longest run of one worker execution, in seconds.')
param replicaTimeout int

var names = loadJsonContent('../names.json')

resource identity 'Microsoft.ManagedIdentity/userAssignedIdentities@2023-01-31' = {
  name: '${prefix}-workers-${suffix}'
  location: location
}

resource registry 'Microsoft.ContainerRegistry/registries@2023-07-01' = {
  name: take(replace('${prefix}${suffix}', '-', ''), 50)
  location: location
  sku: { name: 'Basic' }
  properties: { adminUserEnabled: false }
}

// AcrPull: the job pulls its image with the workers' identity
resource pull 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(registry.id, identity.id, 'acrpull')
  scope: registry
  properties: {
    principalId: identity.properties.principalId
    principalType: 'ServicePrincipal'
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', '7f951dda-4ed3-4680-a7ca-43fe172d538d')
  }
}

resource environment 'Microsoft.App/managedEnvironments@2025-01-01' = {
  name: '${prefix}-env-${suffix}'
  location: location
  properties: {
    appLogsConfiguration: {
      destination: 'log-analytics'
      logAnalyticsConfiguration: { customerId: workspaceCustomerId, sharedKey: workspaceKey }
    }
    workloadProfiles: [ { name: 'Consumption', workloadProfileType: 'Consumption' } ]
  }
}

var env = concat(map(filter(items(settings), s => !contains(secretSettings, s.key)), s => { name: s.key, value: s.value }),
  map(items(secretSettings), s => { name: s.key, secretRef: toLower(replace(s.key, '_', '-')) }), [
  { name: 'AZURE_CLIENT_ID', value: identity.properties.clientId } // DefaultAzureCredential picks this identity
])

resource job 'Microsoft.App/jobs@2025-01-01' = {
  name: '${prefix}-workers-${suffix}'
  location: location
  identity: { type: 'UserAssigned', userAssignedIdentities: { '${identity.id}': {} } }
  dependsOn: [ pull ]
  properties: {
    environmentId: environment.id
    workloadProfileName: 'Consumption'
    configuration: {
      triggerType: 'Event'
      replicaTimeout: replicaTimeout
      replicaRetryLimit: 1
      registries: empty(image) ? [] : [ { server: registry.properties.loginServer, identity: identity.id } ]
      secrets: map(items(secretSettings), s => { name: toLower(replace(s.key, '_', '-')), keyVaultUrl: s.value, identity: identity.id })
      eventTriggerConfig: {
        parallelism: 1
        replicaCompletionCount: 1
        scale: {
          minExecutions: 0
          maxExecutions: maxReplicas
          pollingInterval: 10
          rules: [for queue in names.taskQueues: {
            name: queue
            type: 'azure-queue'
            metadata: { accountName: storageName, queueName: queue, queueLength: string(max(1, slots / tasksPerMessage)) }
            identity: identity.id
          }]
        }
      }
    }
    template: {
      containers: [
        {
          name: 'worker'
          image: empty(image) ? 'mcr.microsoft.com/k8se/quickstart-jobs:latest' : image
          args: [ 'worker', '--slots', string(slots), '--exit-when-idle', string(idleSeconds) ]
          env: env
          resources: { cpu: json(cpu), memory: memory }
        }
      ]
    }
  }
}

output principalId string = identity.properties.principalId
output registry string = registry.properties.loginServer
output jobName string = job.name
