// bagpipe on Azure, from one command (docs/deploy.md):
//   az deployment group create -g RG -f infra/bicep/main.bicep -p prefix=bagpipe
// Storage (the queues, tables and containers the code names, loaded from names.json, which
// `python -m pipeline.deployment` writes from the code's names and settings), the Function App
// (API and portal, planner, completion, monitor), the workers (a Container Apps Job scaled
// from zero on the task queues), email (Communication Services), monitoring (Application
// Insights on Log Analytics). Everything reaches storage by managed identity.

@description('Short prefix of every resource name (lowercase letters and digits).')
@minLength(3)
@maxLength(11)
param prefix string = 'bagpipe'

@description('Azure region of everything but email (which is global).')
param location string = resourceGroup().location

@description('Where Communication Services keep their data (a geography: Europe, United States…).')
param emailDataLocation string = 'Europe'

@description('Send the completion emails (Communication Services with an Azure-managed domain).')
param email bool = true

@description('Local part of the sender address.')
param emailSender string = 'DoNotReply'

@description('Days the data containers (sources, tiles, products, logs) keep a blob; 0: forever.')
param retentionDays int = 90

@description('Where granules are searched: stac (Planetary Computer, no account; deploy in westeurope, next to its storage) or cmr (NASA, needs earthdataToken).')
@allowed([ 'stac', 'cmr' ])
param catalog string = 'stac'

@description('An Earthdata Login bearer token (catalog cmr), kept in the deployment\'s Key Vault.')
@secure()
param earthdataToken string = ''

@description('A Planetary Computer subscription key (catalog stac; raises its rate limits), kept in the deployment\'s Key Vault.')
@secure()
param pcSubscriptionKey string = ''

@description('The worker image in this deployment\'s registry (empty until the first `az acr build`).')
param workerImage string = ''

@description('vCPUs of one worker.')
param workerCpu string = '2'

@description('Memory of one worker.')
param workerMemory string = '4Gi'

@description('Most worker executions at once.')
param workerMaxReplicas int = 20

@description('Tasks one worker runs at once.')
param workerSlots int = 2

@description('Most Function App instances at once.')
param functionMaxInstances int = 40

@description('The Entra ID app registration (its client id) users sign in through (docs/deploy.md); empty: personal API tokens only.')
param entraClientId string = ''

@secure()
@description('That app registration\'s client secret.')
param entraClientSecret string = ''

@description('E-mail addresses (comma-separated) whose first Entra sign-in makes them admins.')
param adminEmails string = ''

@description('The portal\'s public address, which a job\'s email links its page at; empty: the Function App\'s own (https://<app>.azurewebsites.net/portal/). Set it for a custom domain.')
param publicPortalUrl string = ''

@description('Overrides of the code\'s defaults by names.json settings key, e.g. {"killFactor": "3", "window": "512"}; anything unset keeps the code\'s default.')
param tuning object = {}

var names = loadJsonContent('names.json')
var suffix = uniqueString(resourceGroup().id)
// the Function App's own address (modules/functions.bicep names it), known before the app exists: the
// app's settings carry it, so it cannot be the module's output
var portalAddress = empty(publicPortalUrl) ? 'https://${prefix}-fn-${suffix}.azurewebsites.net/portal/' : publicPortalUrl
var entraIssuer = empty(entraClientId) ? '' : '${environment().authentication.loginEndpoint}${tenant().tenantId}/v2.0'
var roles = {
  blobOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b' // Storage Blob Data Owner: host storage, packages, SAS delegation
  blobContributor: 'ba92f5b4-2d11-453d-a403-e96b0029c9fe' // Storage Blob Data Contributor
  queueContributor: '974c5e8b-45b9-4653-ba55-5f855dd0fb88' // Storage Queue Data Contributor
  tableContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3' // Storage Table Data Contributor
}

module storage 'modules/storage.bicep' = {
  name: 'storage'
  params: { name: take('${prefix}${suffix}', 24), location: location, retentionDays: retentionDays }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  params: { prefix: prefix, suffix: suffix, location: location, retentionDays: min(retentionDays, 730) }
}

var secrets = !empty(earthdataToken) || !empty(pcSubscriptionKey)

module vault 'modules/vault.bicep' = if (secrets) {
  name: 'vault'
  params: { prefix: prefix, suffix: suffix, location: location, earthdataToken: earthdataToken, pcSubscriptionKey: pcSubscriptionKey }
}

module mail 'modules/email.bicep' = if (email) {
  name: 'email'
  params: { prefix: prefix, suffix: suffix, dataLocation: emailDataLocation, senderUsername: emailSender }
}

// Every app setting the code reads (names.json "settings"), the same for the Function App
// and the workers. An empty value means the code's default.
var settings = {
  '${names.settings.storageAccount}': storage.outputs.name
  '${names.settings.shards}': string(names.shards)
  '${names.settings.window}': contains(tuning, 'window') ? tuning.window : ''
  '${names.settings.partitions}': contains(tuning, 'partitions') ? tuning.partitions : ''
  '${names.settings.tasksPerMessage}': contains(tuning, 'tasksPerMessage') ? tuning.tasksPerMessage : ''
  '${names.settings.maxTasks}': contains(tuning, 'maxTasks') ? tuning.maxTasks : ''
  '${names.settings.requestsPerMinute}': contains(tuning, 'requestsPerMinute') ? tuning.requestsPerMinute : ''
  '${names.settings.defaultBudgetUsd}': contains(tuning, 'defaultBudgetUsd') ? tuning.defaultBudgetUsd : ''
  '${names.settings.maxAttempts}': contains(tuning, 'maxAttempts') ? tuning.maxAttempts : ''
  '${names.settings.maxTransientAttempts}': contains(tuning, 'maxTransientAttempts') ? tuning.maxTransientAttempts : ''
  '${names.settings.leaseSeconds}': contains(tuning, 'leaseSeconds') ? tuning.leaseSeconds : ''
  '${names.settings.sasMinutes}': contains(tuning, 'sasMinutes') ? tuning.sasMinutes : ''
  '${names.settings.mailMode}': email ? 'acs' : 'none'
  '${names.settings.mailSender}': email ? mail.outputs.sender : ''
  '${names.settings.portalUrl}': portalAddress
  '${names.settings.mailAllowed}': contains(tuning, 'mailAllowed') ? tuning.mailAllowed : ''
  '${names.settings.acsEndpoint}': email ? mail.outputs.endpoint : ''
  '${names.settings.killFactor}': contains(tuning, 'killFactor') ? tuning.killFactor : ''
  '${names.settings.killSigmas}': contains(tuning, 'killSigmas') ? tuning.killSigmas : ''
  '${names.settings.killFloorS}': contains(tuning, 'killFloorS') ? tuning.killFloorS : ''
  '${names.settings.killCeilingS}': contains(tuning, 'killCeilingS') ? tuning.killCeilingS : ''
  '${names.settings.killBackoff}': contains(tuning, 'killBackoff') ? tuning.killBackoff : ''
  '${names.settings.minSamples}': contains(tuning, 'minSamples') ? tuning.minSamples : ''
  '${names.settings.slowRatio}': contains(tuning, 'slowRatio') ? tuning.slowRatio : ''
  '${names.settings.speculateShare}': contains(tuning, 'speculateShare') ? tuning.speculateShare : ''
  '${names.settings.speculateQuantile}': contains(tuning, 'speculateQuantile') ? tuning.speculateQuantile : ''
  '${names.settings.killGraceS}': contains(tuning, 'killGraceS') ? tuning.killGraceS : ''
  '${names.settings.monitorIntervalS}': contains(tuning, 'monitorIntervalS') ? tuning.monitorIntervalS : ''
  '${names.settings.stageLimits}': contains(tuning, 'stageLimits') ? tuning.stageLimits : ''
  '${names.settings.stageModules}': contains(tuning, 'stageModules') ? tuning.stageModules : ''
  '${names.settings.tileStage}': contains(tuning, 'tileStage') ? tuning.tileStage : ''
  '${names.settings.tileBatch}': contains(tuning, 'tileBatch') ? tuning.tileBatch : ''
  '${names.settings.catalog}': catalog
  '${names.settings.stacUrl}': contains(tuning, 'stacUrl') ? tuning.stacUrl : ''
  '${names.settings.stacSasUrl}': contains(tuning, 'stacSasUrl') ? tuning.stacSasUrl : ''
  '${names.settings.pcSubscriptionKey}': empty(pcSubscriptionKey) ? '' : '@Microsoft.KeyVault(SecretUri=${vault.outputs.keyUri})'
  '${names.settings.cmrUrl}': contains(tuning, 'cmrUrl') ? tuning.cmrUrl : ''
  '${names.settings.earthdataToken}': empty(earthdataToken) ? '' : '@Microsoft.KeyVault(SecretUri=${vault.outputs.secretUri})'
  '${names.settings.earthdataHosts}': contains(tuning, 'earthdataHosts') ? tuning.earthdataHosts : ''
  '${names.settings.sandbox}': contains(tuning, 'sandbox') ? tuning.sandbox : ''
  '${names.settings.reducersPath}': '/opt/bagpipe/reducers' // reducers installed in the worker image
  '${names.settings.entraIssuer}': entraIssuer
  '${names.settings.entraClientId}': entraClientId
  '${names.settings.adminEmails}': adminEmails
  '${names.settings.logFormat}': 'json'
  '${names.settings.appinsightsConnection}': monitoring.outputs.connectionString
}

module functions 'modules/functions.bicep' = {
  name: 'functions'
  params: {
    prefix: prefix
    suffix: suffix
    location: location
    storageName: storage.outputs.name
    blobEndpoint: storage.outputs.blobEndpoint
    settings: settings
    maxInstances: functionMaxInstances
    entraClientId: entraClientId
    entraIssuer: entraIssuer
    entraClientSecret: entraClientSecret
  }
}

module workers 'modules/workers.bicep' = {
  name: 'workers'
  params: {
    prefix: prefix
    suffix: suffix
    location: location
    storageName: storage.outputs.name
    settings: settings
    // the Key Vault reference above is the Functions host's syntax: the job reads the secret itself
    secretSettings: union(empty(earthdataToken) ? {} : { '${names.settings.earthdataToken}': vault.outputs.secretUri },
      empty(pcSubscriptionKey) ? {} : { '${names.settings.pcSubscriptionKey}': vault.outputs.keyUri })
    workspaceCustomerId: monitoring.outputs.workspaceCustomerId
    workspaceKey: monitoring.outputs.workspaceKey
    image: workerImage
    cpu: workerCpu
    memory: workerMemory
    maxReplicas: workerMaxReplicas
    slots: workerSlots
    tasksPerMessage: contains(tuning, 'tasksPerMessage') ? int(tuning.tasksPerMessage) : names.tasksPerMessage
    idleSeconds: 60
    replicaTimeout: 21600
  }
}

// The narrowest data roles each identity needs on the account: blob, queue and table.
module functionRoles 'modules/roles.bicep' = {
  name: 'function-roles'
  params: {
    storageName: storage.outputs.name
    principalId: functions.outputs.principalId
    storageRoles: [ roles.blobOwner, roles.queueContributor, roles.tableContributor ]
    communicationId: email ? mail.outputs.id : ''
  }
}

module workerRoles 'modules/roles.bicep' = {
  name: 'worker-roles'
  params: {
    storageName: storage.outputs.name
    principalId: workers.outputs.principalId
    storageRoles: [ roles.blobContributor, roles.queueContributor, roles.tableContributor ]
  }
}

module vaultReaders 'modules/vaultroles.bicep' = if (secrets) {
  name: 'vault-readers'
  params: {
    vaultName: vault.outputs.name
    principalIds: [ functions.outputs.principalId, workers.outputs.principalId ]
  }
}

output portalUrl string = 'https://${functions.outputs.hostName}/portal/'
output apiUrl string = 'https://${functions.outputs.hostName}/api'
output functionApp string = functions.outputs.name
output storageAccount string = storage.outputs.name
output registry string = workers.outputs.registry
output workerJob string = workers.outputs.jobName
